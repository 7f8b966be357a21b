package testenv

import (
	"archive/tar"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// BuildCommit builds ./cmd/delaybridge as it was at commit (a hash, short or
// full, or any name git resolves in this module's clone, e.g. a tag) and
// returns the binary's path: the daemon of an earlier release, for the
// tests of upgrades and rollbacks. The commit's tree is taken from git
// (git archive, so the working tree is not touched), extracted into the
// build directory Build uses and built there with the commit's own go.mod,
// once per test process and commit (with -race when Build's are).
//
// A commit the clone does not hold fails the test, saying why: most often
// a shallow clone (git clone --depth 1, the default of some CI checkouts),
// which `git fetch --unshallow` completes. Nothing here skips.
func BuildCommit(t testing.TB, commit string) string {
	skipShort(t, "the delaybridge binary of an earlier commit")
	t.Helper()
	root, err := moduleRoot()
	if err != nil {
		t.Fatalf("testenv: build %s: %v", commit, err)
	}
	hash, err := resolveCommit(root, commit)
	if err != nil {
		t.Fatalf("testenv: build ./cmd/delaybridge of commit %s: %v", commit, err)
	}
	return onceFor(t, "./cmd/delaybridge@"+hash, func() (string, error) { return buildCommit(root, hash) })
}

// resolveCommit returns the full hash of commit in the git clone at root,
// or an error that says what to do when the clone does not hold it.
func resolveCommit(root, commit string) (string, error) {
	if _, err := exec.LookPath("git"); err != nil {
		return "", fmt.Errorf("git not found in PATH: it is needed to read the commit's tree; %s", depsHint)
	}
	git := func(args ...string) (string, error) {
		cmd := exec.Command("git", append([]string{"-C", root}, args...)...)
		var stderr bytes.Buffer
		cmd.Stderr = &stderr
		out, err := cmd.Output()
		if err != nil {
			return "", fmt.Errorf("git %s: %v: %s", strings.Join(args, " "), err, strings.TrimSpace(stderr.String()))
		}
		return strings.TrimSpace(string(out)), nil
	}
	if _, err := git("rev-parse", "--git-dir"); err != nil {
		return "", fmt.Errorf("%s is not a git clone (a source archive?), so the commit's tree cannot be read: run the tests from a clone of the repository with its history (%v)", root, err)
	}
	hash, err := git("rev-parse", "--verify", "--quiet", "--end-of-options", commit+"^{commit}")
	if err == nil && hash != "" {
		return hash, nil
	}
	if shallow, _ := git("rev-parse", "--is-shallow-repository"); shallow == "true" {
		return "", fmt.Errorf("the clone at %s is shallow (git clone --depth) and does not hold commit %s: "+
			"run `git fetch --unshallow` there (or clone without --depth), then the tests again", root, commit)
	}
	return "", fmt.Errorf("the clone at %s does not hold commit %s: fetch it (`git fetch origin`, or `git fetch --unshallow` for a shallow clone), then run the tests again", root, commit)
}

// buildCommit extracts the tree of the commit hash into the process's build
// directory and builds ./cmd/delaybridge there.
func buildCommit(root, hash string) (string, error) {
	dir, err := sharedBuildDir()
	if err != nil {
		return "", err
	}
	src := filepath.Join(dir, "src-"+hash[:12])
	out := filepath.Join(dir, "delaybridge-"+hash[:12])
	if err := os.RemoveAll(src); err != nil {
		return "", err
	}
	if err := extractCommit(root, hash, src); err != nil {
		return "", err
	}
	defer os.RemoveAll(src) // the binary is all that is needed; the go build cache keeps the rest
	goBin, err := exec.LookPath("go")
	if err != nil {
		goBin = filepath.Join(os.Getenv("GOROOT"), "bin", "go")
	}
	// -buildvcs=false: the extracted tree has no .git of its own.
	// -trimpath: the compiled packages do not depend on the directory, which
	// is new in each test process, so the go build cache serves the next
	// process's build of the same commit (a link, ~10 s, instead of ~35 s of
	// CPU).
	args := []string{"build", "-buildvcs=false", "-trimpath", "-o", out}
	if raceDaemon() {
		args = append(args, "-race")
	}
	args = append(args, "./cmd/delaybridge")
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, goBin, args...)
	cmd.Dir = src
	// GOWORK=off: the tree is built with its own go.mod, whatever workspace
	// surrounds the test's module.
	cmd.Env = append(os.Environ(), "GOWORK=off")
	if output, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("go %s (in a copy of commit %s's tree): %v\n%s", strings.Join(args, " "), hash[:12], err, output)
	}
	return out, nil
}

// extractCommit writes the tree of commit hash into dst, as `git archive
// hash | tar -x -C dst` does.
func extractCommit(root, hash, dst string) error {
	cmd := exec.Command("git", "-C", root, "archive", "--format=tar", hash)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	pipe, err := cmd.StdoutPipe()
	if err != nil {
		return err
	}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("git archive %s: %v", hash[:12], err)
	}
	xerr := untar(pipe, dst)
	if xerr != nil {
		_, _ = io.Copy(io.Discard, pipe) // let git finish writing
	}
	werr := cmd.Wait()
	switch {
	case werr != nil:
		return fmt.Errorf("git archive %s: %v: %s", hash[:12], werr, strings.TrimSpace(stderr.String()))
	case xerr != nil:
		return fmt.Errorf("extracting commit %s's tree into %s: %w", hash[:12], dst, xerr)
	}
	return nil
}

// untar extracts a tar stream of directories, regular files and symbolic
// links (what git archive writes) into dst.
func untar(r io.Reader, dst string) error {
	tr := tar.NewReader(r)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return err
		}
		name := filepath.Clean(h.Name)
		if name == "." || filepath.IsAbs(name) || name == ".." || strings.HasPrefix(name, ".."+string(filepath.Separator)) {
			continue // git archive writes neither; never outside dst
		}
		p := filepath.Join(dst, name)
		switch h.Typeflag {
		case tar.TypeDir:
			if err := os.MkdirAll(p, 0o755); err != nil {
				return err
			}
		case tar.TypeReg:
			if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
				return err
			}
			f, err := os.OpenFile(p, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, os.FileMode(h.Mode)&0o777|0o600)
			if err != nil {
				return err
			}
			if _, err := io.Copy(f, tr); err != nil {
				f.Close()
				return err
			}
			if err := f.Close(); err != nil {
				return err
			}
		case tar.TypeSymlink:
			if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
				return err
			}
			if err := os.Symlink(h.Linkname, p); err != nil {
				return err
			}
		default:
			// pax global headers (the commit ID) and anything else: nothing to write
		}
	}
}
