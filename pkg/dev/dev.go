// Package dev runs delaybridge end to end on one machine for a first look
// (`delaybridge dev`): an embedded NATS server with JetStream as ingest and
// sink, Redis (a redis-server child process when one is installed, else an
// in-process Redis-protocol server that keeps nothing across restarts), and
// the daemon itself. It prints every message that fires.
//
// The set-up is the one docs recommend, so that it prints no warning about
// its own choices: a JetStream sink (a stream, FIRED, holds what fires), an
// admin token (kept in the state directory), allowed destinations. It ends
// when its context does, when the process that started it goes away
// (Options.ParentPID), and takes its redis-server with it.
package dev

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/redis/go-redis/v9"

	"github.com/delaybridge/delaybridge/pkg/brokers"
	"github.com/delaybridge/delaybridge/pkg/config"
	"github.com/delaybridge/delaybridge/pkg/daemon"
	"github.com/delaybridge/delaybridge/pkg/envelope"
)

// The ports dev asks for first; when one is taken (another dev still
// running?) it takes a free one and says so.
const (
	AdminListen = "127.0.0.1:7070"
	NATSPort    = 4222
)

// Files in the state directory besides the NATS and Redis data.
const (
	ConfigFile = "config.yaml" // the configuration the daemon runs with
	TokenFile  = "admin-token" // admin.token, made once
	EnvFile    = "env"         // `. .delaybridge-dev/env` sets DB, AUTH, DELAYBRIDGE_ADMIN and DELAYBRIDGE_ADMIN_TOKEN
)

// Options of a dev run.
type Options struct {
	Dir       string // state directory (config, token, NATS and Redis data)
	Out       io.Writer
	Log       *slog.Logger
	SelfPath  string // how to invoke this binary, for the printed hints
	NoWelcome bool   // do not send the welcome message
	// ParentPID, when not 0, is the process that started this one (its
	// parent at start): once this process has another parent (that one
	// exited: `go run` killed by its PID, a closed terminal), Run ends as if
	// its context had.
	ParentPID int
}

// parentPoll is how often Run looks whether its parent has gone.
const parentPoll = 200 * time.Millisecond

// Run starts everything and blocks until ctx ends or the parent goes.
func Run(ctx context.Context, o Options) error {
	dir, err := filepath.Abs(o.Dir)
	if err != nil {
		return err
	}
	o.Dir = dir
	if err := os.MkdirAll(o.Dir, 0o755); err != nil {
		return fmt.Errorf("state directory %s: %w", o.Dir, err)
	}
	out := o.Out
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	if o.ParentPID != 0 {
		go watchParent(ctx, cancel, o.ParentPID)
	}

	ns, err := startNATS(filepath.Join(o.Dir, "nats"))
	if err != nil {
		return fmt.Errorf("embedded nats: %w", err)
	}
	defer ns.Shutdown()
	natsURL := ns.ClientURL()
	if ns.Addr().(*net.TCPAddr).Port != NATSPort {
		fmt.Fprintf(out, "note: port %d is in use (another delaybridge dev, or a NATS server?); NATS listens on %s instead.\n", NATSPort, natsURL)
	}

	redisAddr, inProcess, stopRedis, err := startRedis(ctx, filepath.Join(o.Dir, "redis"), out)
	if err != nil {
		return fmt.Errorf("redis: %w", err)
	}
	defer stopRedis()

	adminListen := AdminListen
	if !portFree(adminListen) {
		adminListen = "127.0.0.1:0"
	}
	tokenPath := filepath.Join(o.Dir, TokenFile)
	token, err := adminToken(tokenPath)
	if err != nil {
		return err
	}
	cfgPath := filepath.Join(o.Dir, ConfigFile)
	cfgText := fmt.Sprintf(configTemplate, redisAddr, adminListen, tokenPath, natsURL, natsURL)
	if err := os.WriteFile(cfgPath, []byte(cfgText), 0o644); err != nil {
		return err
	}
	cfg, err := config.Load(cfgPath)
	if err != nil {
		return fmt.Errorf("generated config %s: %w", cfgPath, err)
	}

	nc, err := nats.Connect(natsURL, nats.Name("delaybridge dev printer"))
	if err != nil {
		return err
	}
	defer nc.Close()
	if err := firedStream(ctx, nc); err != nil {
		return err
	}
	if _, err := nc.Subscribe("fired.>", func(m *nats.Msg) { printFired(out, m) }); err != nil {
		return err
	}

	// The daemon's components log their start warnings to slog's default
	// logger: send them to dev's, without the one about its own in-process
	// Redis, which dev states itself.
	prev := slog.Default()
	slog.SetDefault(slog.New(dropOwnChoices{o.Log.Handler(), inProcess}))
	defer slog.SetDefault(prev)

	d, err := daemon.New(ctx, cfg, o.Log)
	if err != nil {
		return err
	}
	runErr := make(chan error, 1)
	go func() { runErr <- d.Run(ctx) }()

	admin := d.AdminAddr()
	for admin == "" || strings.HasSuffix(admin, ":0") {
		select {
		case err := <-runErr:
			return err
		case <-time.After(10 * time.Millisecond):
			admin = d.AdminAddr()
		}
	}
	adminURL := "http://" + admin
	if err := writeEnv(filepath.Join(o.Dir, EnvFile), adminURL, token); err != nil {
		return err
	}
	if admin != AdminListen {
		fmt.Fprintf(out, "note: %s is in use (another delaybridge dev still running?); the admin API is on %s instead.\n", AdminListen, adminURL)
	}
	show := shortPath(o.Dir)
	fmt.Fprintf(out, `
delaybridge dev is running.
  NATS (JetStream)  %s   ingest: subject delayed.> (stream DELAYED); fired messages: fired.> (stream FIRED)
  Redis             %s
  admin API         %s
  dashboard         %s   (open it in a browser: the link carries the admin token)
  admin token       %s   (in %s)
  config            %s

From another terminal, in this directory:
  . %s      # sets DB and DELAYBRIDGE_ADMIN (the admin URL), DELAYBRIDGE_ADMIN_TOKEN, and AUTH for curl
  %s send -c %s --ingest dev --delay 10s "hello again"
  %s send -c %s --ingest dev --at %s --header x-delay-destination=fired.reminders "a reminder"
  curl -s -H "$AUTH" $DB/v1/stats

Fired messages appear below. Ctrl-C stops everything.
`, natsURL, redisAddr, adminURL, DashboardLink(adminURL, token), token, filepath.Join(show, TokenFile), filepath.Join(show, ConfigFile),
		filepath.Join(show, EnvFile),
		o.SelfPath, filepath.Join(show, ConfigFile), o.SelfPath, filepath.Join(show, ConfigFile),
		time.Now().Add(time.Minute).UTC().Format(time.RFC3339))

	if !o.NoWelcome {
		at, err := brokers.Send(ctx, cfg, brokers.SendRequest{Ingest: "dev", Delay: "5s", Body: []byte("hello from delaybridge")})
		due, _ := brokers.DueAfter(at, 5*time.Second, time.Now())
		if err != nil {
			fmt.Fprintf(out, "could not send the welcome message: %v\n", err)
		} else {
			fmt.Fprintf(out, "\nsent \"hello from delaybridge\" with x-delay: 5s; it fires at %s\n", due.Format("15:04:05.000"))
		}
	}
	return <-runErr
}

// DashboardLink is the link that opens the dashboard of the admin API at
// adminURL with its token: the token rides in the fragment, which a browser
// never sends to the server; the page keeps it for the tab's session and
// takes it out of the address bar.
func DashboardLink(adminURL, token string) string {
	// Encoded as the page decodes it (decodeURIComponent): a space as %20.
	return strings.TrimRight(adminURL, "/") + "/#token=" + strings.ReplaceAll(url.QueryEscape(token), "+", "%20")
}

// configTemplate is the dev configuration: the at-least-once set-up the
// docs recommend, on loopback.
const configTemplate = `# Written by delaybridge dev at every start. Every key: config.example.yaml, docs/reference.md.
redis:
  addr: %s
  key_prefix: delaybridge-dev
admin:
  listen: %s
  token_file: %s
log:
  level: warn
ingest:
  - name: dev
    nats: {url: "%s", subject: "delayed.>", stream: DELAYED, durable: delaybridge}
    route:
      sink: nats
      destination: fired.dev
      allow_override: true
      allowed_destinations: ["fired.*"]
sinks:
  - name: nats
    nats: {url: "%s", jetstream: true}   # the stream FIRED holds fired.>
`

// firedStream makes (or keeps) the stream that takes what the sink
// publishes, so that each publish is confirmed. It keeps an hour of them.
func firedStream(ctx context.Context, nc *nats.Conn) error {
	js, err := jetstream.New(nc)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	_, err = js.CreateOrUpdateStream(ctx, jetstream.StreamConfig{
		Name: "FIRED", Subjects: []string{"fired.>"}, MaxAge: time.Hour, Storage: jetstream.FileStorage,
	})
	if err != nil {
		return fmt.Errorf("embedded nats: stream FIRED for fired.>: %w", err)
	}
	return nil
}

// adminToken reads the token kept at path, or makes one.
func adminToken(path string) (string, error) {
	if b, err := os.ReadFile(path); err == nil && len(strings.TrimSpace(string(b))) >= 16 {
		return strings.TrimSpace(string(b)), nil
	}
	raw := make([]byte, 16)
	if _, err := rand.Read(raw); err != nil {
		return "", err
	}
	token := "dev-" + hex.EncodeToString(raw)
	if err := os.WriteFile(path, []byte(token+"\n"), 0o600); err != nil {
		return "", fmt.Errorf("admin token %s: %w", path, err)
	}
	return token, nil
}

// writeEnv writes the shell file that points curl (DB, AUTH) and the CLI
// (DELAYBRIDGE_ADMIN and DELAYBRIDGE_ADMIN_TOKEN, the defaults of --admin
// and --token) at this run's admin API.
func writeEnv(path, adminURL, token string) error {
	text := fmt.Sprintf(`# Written by delaybridge dev: source it (. %s) to talk to its admin API.
export DB=%s
export DELAYBRIDGE_ADMIN=%s
export DELAYBRIDGE_ADMIN_TOKEN=%s
export AUTH="Authorization: Bearer $DELAYBRIDGE_ADMIN_TOKEN"
`, path, adminURL, adminURL, token)
	return os.WriteFile(path, []byte(text), 0o600)
}

// shortPath is dir relative to the working directory when it is inside it.
func shortPath(dir string) string {
	wd, err := os.Getwd()
	if err != nil {
		return dir
	}
	rel, err := filepath.Rel(wd, dir)
	if err != nil || rel == ".." || strings.HasPrefix(rel, ".."+string(filepath.Separator)) {
		return dir
	}
	return rel
}

// watchParent cancels when this process's parent is no longer ppid.
func watchParent(ctx context.Context, cancel context.CancelFunc, ppid int) {
	t := time.NewTicker(parentPoll)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			if os.Getppid() != ppid {
				cancel()
				return
			}
		}
	}
}

// dropOwnChoices drops the daemon's start warning about a Redis that reads
// no script flags when that Redis is dev's in-process one: dev says so
// itself when it starts it.
type dropOwnChoices struct {
	slog.Handler
	inProcessRedis bool
}

func (h dropOwnChoices) Handle(ctx context.Context, r slog.Record) error {
	if h.inProcessRedis && strings.HasPrefix(r.Message, "this Redis does not read Lua script flags") {
		return nil
	}
	return h.Handler.Handle(ctx, r)
}

func (h dropOwnChoices) WithAttrs(as []slog.Attr) slog.Handler {
	return dropOwnChoices{h.Handler.WithAttrs(as), h.inProcessRedis}
}

func (h dropOwnChoices) WithGroup(name string) slog.Handler {
	return dropOwnChoices{h.Handler.WithGroup(name), h.inProcessRedis}
}

func printFired(out io.Writer, m *nats.Msg) {
	line := fmt.Sprintf("%s  fired  subject=%s", time.Now().Format("15:04:05.000"), m.Subject)
	if due, err := time.Parse(time.RFC3339Nano, m.Header.Get(envelope.HeaderDueAt)); err == nil {
		line += fmt.Sprintf("  due=%s  late=%dms", due.Local().Format("15:04:05.000"), time.Since(due).Milliseconds())
	}
	line += fmt.Sprintf("  id=%s  attempt=%s  body=%q", m.Header.Get(envelope.HeaderMessageID), m.Header.Get(envelope.HeaderAttempt), truncate(m.Data, 200))
	fmt.Fprintln(out, line)
}

func truncate(b []byte, n int) string {
	if len(b) > n {
		return string(b[:n]) + "..."
	}
	return string(b)
}

func startNATS(dir string) (*server.Server, error) {
	port := NATSPort
	if !portFree(net.JoinHostPort("127.0.0.1", strconv.Itoa(NATSPort))) {
		port = -1
	}
	ns, err := server.NewServer(&server.Options{
		Host: "127.0.0.1", Port: port, JetStream: true, StoreDir: dir, NoLog: true, NoSigs: true,
	})
	if err != nil {
		return nil, err
	}
	go ns.Start()
	if !ns.ReadyForConnections(10 * time.Second) {
		ns.Shutdown()
		return nil, errors.New("not ready after 10s")
	}
	return ns, nil
}

// startRedis starts redis-server from PATH as a child with its data in dir,
// or, when none is installed, an in-process Redis-protocol server.
func startRedis(ctx context.Context, dir string, out io.Writer) (addr string, inProcess bool, stop func(), err error) {
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		m, err := miniredis.Run()
		if err != nil {
			return "", false, nil, err
		}
		fmt.Fprintln(out, "WARNING: redis-server is not installed; using an in-process Redis-protocol server (miniredis).\n"+
			"         Nothing parked survives a restart, and it reads no Lua script flags (at maxmemory, firing\n"+
			"         would stop with ingest). Install Redis for the real thing: apt-get install -y redis-server")
		return m.Addr(), true, m.Close, nil
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", false, nil, err
	}
	port := freePort()
	addr = "127.0.0.1:" + strconv.Itoa(port)
	logPath := filepath.Join(dir, "redis.log")
	cmd := exec.Command(bin, "--port", strconv.Itoa(port), "--bind", "127.0.0.1", "--dir", dir,
		"--appendonly", "yes", "--save", "", "--logfile", logPath)
	wait, err := startChild(cmd)
	if err != nil {
		return "", false, nil, fmt.Errorf("start %s: %w", bin, err)
	}
	exited := make(chan struct{})
	go func() { _ = wait(); close(exited) }()
	stop = func() {
		_ = cmd.Process.Signal(os.Interrupt)
		select {
		case <-exited:
		case <-time.After(5 * time.Second):
			_ = cmd.Process.Kill()
			<-exited
		}
	}
	rdb := redis.NewClient(&redis.Options{Addr: addr})
	defer rdb.Close()
	deadline := time.Now().Add(10 * time.Second)
	for {
		if err := rdb.Ping(ctx).Err(); err == nil {
			return addr, false, stop, nil
		}
		select {
		case <-exited:
			return "", false, nil, fmt.Errorf("redis-server on %s exited at start; see %s", addr, logPath)
		default:
		}
		if time.Now().After(deadline) {
			stop()
			return "", false, nil, fmt.Errorf("redis-server on %s did not answer within 10s; see %s", addr, logPath)
		}
		time.Sleep(20 * time.Millisecond) // polling a child process with a deadline
	}
}

func portFree(addr string) bool {
	l, err := net.Listen("tcp", addr)
	if err != nil {
		return false
	}
	_ = l.Close()
	return true
}

func freePort() int {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 6379
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}
