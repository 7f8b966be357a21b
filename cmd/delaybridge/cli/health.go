package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"time"

	"github.com/spf13/cobra"

	"github.com/delaybridge/delaybridge/pkg/config"
)

// healthCmd probes a running daemon's admin server, for container
// HEALTHCHECKs in images without curl.
func (a *app) healthCmd() *cobra.Command {
	var (
		url     string
		ready   bool
		timeout time.Duration
	)
	cmd := &cobra.Command{
		Use: "health [--url URL] [--ready]",
		Example: `  delaybridge health -c config.yaml --ready   # in a container's probe
  delaybridge health --url http://127.0.0.1:7070`,
		Short: "Exit 0 when a running daemon answers /healthz (or /readyz with --ready) with 200",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			path := "/healthz"
			if ready {
				path = "/readyz"
			}
			if url == "" {
				listen := config.DefaultAdminListen
				if a.configPath != "" {
					cfg, err := a.load()
					if err != nil {
						return err
					}
					listen = cfg.Admin.Listen
				}
				if listen == "" {
					return exit(2, errors.New("admin.listen is empty: the daemon has no admin server to ask"))
				}
				url = "http://" + listen + path
			}
			ctx, cancel := context.WithTimeout(cmd.Context(), timeout)
			defer cancel()
			req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
			if err != nil {
				return exit(2, err)
			}
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				return exit(1, fmt.Errorf("%s: %w", url, err))
			}
			defer resp.Body.Close()
			body, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
			if resp.StatusCode != http.StatusOK {
				return exit(1, fmt.Errorf("%s: %s %s", url, resp.Status, body))
			}
			fmt.Fprintf(a.stdout, "%s: %s", url, body)
			return nil
		},
	}
	cmd.Flags().StringVar(&url, "url", "", "URL to probe (default: http://<admin.listen>/healthz from --config, else 127.0.0.1:7070)")
	cmd.Flags().BoolVar(&ready, "ready", false, "probe /readyz instead of /healthz")
	cmd.Flags().DurationVar(&timeout, "timeout", 3*time.Second, "give up after this long")
	return cmd
}
