package testenv

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

const (
	rabbitBinDir       = "/usr/lib/rabbitmq/bin"
	rabbitNodeName     = "testenv@localhost"
	rabbitReadyTimeout = 120 * time.Second

	// RabbitClientCN is the common name of the shared node's client certificate
	// (RabbitNode.Certs.ClientCert): the user that SASL EXTERNAL logs in as.
	RabbitClientCN = "delaybridge-test-client"
)

// RabbitNode is a throwaway rabbitmq-server node (a plain process, not the system
// service) shared by every test of one test binary.
type RabbitNode struct {
	URL      string // amqp://guest:guest@127.0.0.1:PORT/
	Port     int    // AMQP port
	TLSURL   string // amqps://guest:guest@127.0.0.1:TLSPORT/ (verify with Certs.CAFile)
	TLSPort  int    // AMQP over TLS port
	DistPort int    // Erlang distribution port of the node
	EPMDPort int    // private epmd's port (ERL_EPMD_PORT)
	Node     string // Erlang node name, for rabbitmqctl -n
	Dir      string // all state: mnesia, logs, HOME with the Erlang cookie

	// Certs is the node's PKI, generated once per node: the TLS listener serves
	// Certs.ServerCert (valid for 127.0.0.1 and localhost) and verifies client
	// certificates with Certs.CAFile; Certs.ClientCert has CN RabbitClientCN.
	Certs *Certs

	env      []string
	pidFile  string
	release  func()
	mu       sync.Mutex
	proc     *child // rabbitmq-server (a shell script running beam.smp as its child)
	epmd     *child
	stopOnce sync.Once

	usersMu  sync.Mutex
	external bool // the EXTERNAL user exists
}

var (
	rabbitOnce sync.Once
	rabbitNode *RabbitNode
	rabbitErr  error
)

// RabbitMQ returns the rabbitmq-server node shared by the whole test binary, starting
// it on the first call (~4 s, ~210 MB RSS). The node runs as a plain process from
// /usr/lib/rabbitmq/bin with all state in a temp dir, listening on 127.0.0.1 only, on
// four ports drawn at random from [20000, 30000) and reserved (AMQP, AMQP over TLS,
// Erlang distribution, and a private epmd's, so it never touches the system epmd on
// 4369).
//
// The TLS listener (TLSURL) uses Certs: it asks for a client certificate and verifies
// one that is given (verify_peer) but does not require it (fail_if_no_peer_cert
// false). The rabbitmq_auth_mechanism_ssl plugin is enabled, and the node offers
// PLAIN, AMQPLAIN and EXTERNAL; EXTERNAL (offered only to TLS connections with a
// client certificate) maps the certificate's common name to a user, which
// ExternalUser creates. AddUser creates password users.
// HOME, RABBITMQ_* and ERL_* are set in the child's environment only. If the node was
// stopped with Stop, RabbitMQ starts it again.
//
// Caveats: the node is SHARED: tests must use their own queue/exchange names (or a
// vhost) and must not run in parallel with a test that calls Stop. The test binary's
// TestMain should call Main, which stops the node and removes its dir; without Main,
// the node still dies with the test binary (parent-death signal), but its temp dir
// stays behind. The guest user is allowed because clients come from loopback.
// Debian's rabbitmq-server 3.10 has no delayed-message plugin.
func RabbitMQ(t testing.TB) *RabbitNode {
	skipShort(t, "a RabbitMQ node")
	t.Helper()
	// Check the binaries on every call, so that a missing install fails each test
	// with the hint rather than only the first one.
	server := lookBinary(t, "rabbitmq-server", filepath.Join(rabbitBinDir, "rabbitmq-server"))
	if filepath.Dir(server) != rabbitBinDir {
		// The /usr/sbin wrappers switch user and log to /var/log: use the real scripts.
		server = filepath.Join(rabbitBinDir, "rabbitmq-server")
		if _, err := os.Stat(server); err != nil {
			t.Fatalf("testenv: %s not found; %s", server, depsHint)
		}
	}
	epmd := lookBinary(t, "epmd", "/usr/lib/erlang/bin/epmd")

	rabbitOnce.Do(func() {
		rabbitNode, rabbitErr = newRabbitNode(server, epmd)
	})
	if rabbitErr != nil {
		t.Fatalf("testenv: rabbitmq node: %v", rabbitErr)
	}
	r := rabbitNode
	if !r.running() {
		r.Start(t)
	}
	return r
}

func newRabbitNode(server, epmd string) (*RabbitNode, error) {
	// Four distinct reserved ports, each in [20000, 30000).
	var ports [4]int
	var releases []func()
	releaseAll := func() {
		for _, f := range releases {
			f()
		}
	}
	for i := range ports {
		p, rel, err := tryReserve(20000, 30000)
		if err != nil {
			releaseAll()
			return nil, err
		}
		ports[i] = p
		releases = append(releases, rel)
	}
	dir, err := mkProcessTempDir("testenv-rabbitmq-")
	if err != nil {
		releaseAll()
		return nil, err
	}
	r := &RabbitNode{
		URL:      fmt.Sprintf("amqp://guest:guest@127.0.0.1:%d/", ports[0]),
		Port:     ports[0],
		TLSURL:   fmt.Sprintf("amqps://guest:guest@127.0.0.1:%d/", ports[3]),
		TLSPort:  ports[3],
		DistPort: ports[1],
		EPMDPort: ports[2],
		Node:     rabbitNodeName,
		Dir:      dir,
		pidFile:  filepath.Join(dir, "node.pid"),
		release:  releaseAll,
	}
	if r.Certs, err = nodeCerts(filepath.Join(dir, "certs")); err != nil {
		r.shutdown()
		return nil, err
	}
	if err := r.writeFiles(); err != nil {
		r.shutdown()
		return nil, err
	}
	r.env = r.childEnv()

	// A private epmd in the foreground, so that it is ours to stop (an epmd that the
	// node starts itself daemonizes and outlives the node).
	cmd := exec.Command(epmd, "-port", strconv.Itoa(r.EPMDPort), "-address", "127.0.0.1")
	cmd.Env = r.env
	if r.epmd, err = startWatched(cmd, syscall.SIGKILL); err != nil {
		r.shutdown()
		return nil, fmt.Errorf("start epmd: %w", err)
	}
	epmdAddr := net.JoinHostPort("127.0.0.1", strconv.Itoa(r.EPMDPort))
	if !Poll(10*time.Second, func() bool { return r.epmd.exited() || canDial(epmdAddr) }) || r.epmd.exited() {
		r.shutdown()
		return nil, fmt.Errorf("epmd on port %d did not start (%v)", r.EPMDPort, r.epmd.err)
	}
	if err := r.start(server); err != nil {
		r.shutdown()
		return nil, err
	}
	return r, nil
}

func (r *RabbitNode) writeFiles() error {
	files := map[string]string{
		"empty.conf":      "",
		"enabled_plugins": "[rabbitmq_auth_mechanism_ssl].\n",
		"rabbitmq.conf": fmt.Sprintf("listeners.tcp.default = 127.0.0.1:%d\n"+
			"listeners.ssl.default = 127.0.0.1:%d\n"+
			"ssl_options.cacertfile = %s\n"+
			"ssl_options.certfile = %s\n"+
			"ssl_options.keyfile = %s\n"+
			"ssl_options.verify = verify_peer\n"+
			"ssl_options.fail_if_no_peer_cert = false\n"+
			"auth_mechanisms.1 = PLAIN\n"+
			"auth_mechanisms.2 = AMQPLAIN\n"+
			"auth_mechanisms.3 = EXTERNAL\n"+
			"ssl_cert_login_from = common_name\n"+
			"log.console = false\n"+
			"log.file.level = info\n"+
			"disk_free_limit.absolute = 50MB\n",
			r.Port, r.TLSPort, r.Certs.CAFile, r.Certs.ServerCert, r.Certs.ServerKey),
	}
	for name, content := range files {
		if err := os.WriteFile(filepath.Join(r.Dir, name), []byte(content), 0o644); err != nil {
			return err
		}
	}
	for _, d := range []string{"home", "mnesia", "log"} {
		if err := os.MkdirAll(filepath.Join(r.Dir, d), 0o755); err != nil {
			return err
		}
	}
	return nil
}

// childEnv is the test process's environment without HOME, RABBITMQ_* and ERL_*
// variables, plus the node's own settings. It is only ever given to children.
func (r *RabbitNode) childEnv() []string {
	var env []string
	for _, kv := range os.Environ() {
		k, _, _ := strings.Cut(kv, "=")
		if k == "HOME" || k == "LANG" || k == "LC_ALL" || strings.HasPrefix(k, "RABBITMQ_") || strings.HasPrefix(k, "ERL_") {
			continue
		}
		env = append(env, kv)
	}
	noEpmd := "-start_epmd false" // the private epmd is already running
	return append(env,
		"HOME="+filepath.Join(r.Dir, "home"),
		"LANG=C.UTF-8", "LC_ALL=C.UTF-8", // else the Elixir CLI warns about latin1
		"RABBITMQ_CONF_ENV_FILE="+filepath.Join(r.Dir, "empty.conf"),
		"RABBITMQ_NODENAME="+r.Node,
		"RABBITMQ_NODE_IP_ADDRESS=127.0.0.1",
		"RABBITMQ_NODE_PORT="+strconv.Itoa(r.Port),
		"RABBITMQ_DIST_PORT="+strconv.Itoa(r.DistPort),
		"ERL_EPMD_PORT="+strconv.Itoa(r.EPMDPort),
		"ERL_EPMD_ADDRESS=127.0.0.1",
		"RABBITMQ_MNESIA_BASE="+filepath.Join(r.Dir, "mnesia"),
		"RABBITMQ_LOG_BASE="+filepath.Join(r.Dir, "log"),
		"RABBITMQ_CONFIG_FILE="+filepath.Join(r.Dir, "rabbitmq.conf"),
		"RABBITMQ_ENABLED_PLUGINS_FILE="+filepath.Join(r.Dir, "enabled_plugins"),
		"RABBITMQ_PID_FILE="+r.pidFile,
		// +sbwt none and its two kin: an idle scheduler thread sleeps instead
		// of spinning for work, which Erlang does by default and which cost
		// the other test binaries (and the node's own deliveries) CPU on
		// a machine that runs several nodes at once.
		"RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS=-kernel inet_dist_use_interface {127,0,0,1} "+noEpmd+" +sbwt none +sbwtdcpu none +sbwtdio none",
		// rabbitmqctl is an Erlang node too; by default it listens on fixed ports
		// 35672-35682, which concurrent test binaries would fight over. 0 lets the
		// kernel pick.
		"RABBITMQ_CTL_DIST_PORT_MIN=0",
		"RABBITMQ_CTL_DIST_PORT_MAX=0",
		"RABBITMQ_CTL_ERL_ARGS="+noEpmd,
	)
}

func canDial(addr string) bool {
	c, err := net.DialTimeout("tcp", addr, time.Second)
	if err != nil {
		return false
	}
	c.Close()
	return true
}

func (r *RabbitNode) running() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.proc != nil && !r.proc.exited()
}

// start launches rabbitmq-server and waits until an AMQP connection as guest
// succeeds (the listener opens at the end of the boot, after the default user exists)
// and the TLS listener accepts TCP connections.
func (r *RabbitNode) start(server string) error {
	r.mu.Lock()
	if r.proc != nil && !r.proc.exited() {
		r.mu.Unlock()
		return errors.New("already running")
	}
	_ = os.Remove(r.pidFile) // a stale pid file makes `rabbitmqctl wait/stop` wait on a dead pid
	out, err := os.OpenFile(filepath.Join(r.Dir, "stdout.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		r.mu.Unlock()
		return err
	}
	cmd := exec.Command(server)
	cmd.Dir = r.Dir
	cmd.Env = r.env
	cmd.Stdout, cmd.Stderr = out, out
	// The script traps SIGTERM and stops the VM properly: that is the death signal.
	proc, err := startWatched(cmd, syscall.SIGTERM)
	out.Close()
	if err != nil {
		r.mu.Unlock()
		return fmt.Errorf("start %s: %w", server, err)
	}
	r.proc = proc
	r.mu.Unlock()

	var lastErr error
	ok := Poll(rabbitReadyTimeout, func() bool {
		if proc.exited() {
			return true
		}
		conn, err := amqp.DialConfig(r.URL, amqp.Config{Dial: amqp.DefaultDial(2 * time.Second)})
		if err != nil {
			lastErr = err
			return false
		}
		conn.Close()
		// The TLS listener opens with the plain one; make sure of it.
		if tlsAddr := net.JoinHostPort("127.0.0.1", strconv.Itoa(r.TLSPort)); !canDial(tlsAddr) {
			lastErr = fmt.Errorf("TLS listener %s not open", tlsAddr)
			return false
		}
		return true
	})
	if proc.exited() {
		return fmt.Errorf("rabbitmq-server exited at start (%v); %s", proc.err, r.logs())
	}
	if !ok {
		return fmt.Errorf("rabbitmq-server not ready on %s after %v (last: %v); %s", r.URL, rabbitReadyTimeout, lastErr, r.logs())
	}
	return nil
}

// logs returns the tails of the node's logs, for failure messages.
func (r *RabbitNode) logs() string {
	s := "stdout tail:\n" + tail(filepath.Join(r.Dir, "stdout.log"), 2000)
	logs, _ := filepath.Glob(filepath.Join(r.Dir, "log", "*.log"))
	for _, l := range logs {
		s += "\n" + filepath.Base(l) + " tail:\n" + tail(l, 3000)
	}
	return s
}

// Start starts the node again on the same ports and data (durable queues and their
// persistent messages survive a Stop) and waits until it accepts AMQP connections.
func (r *RabbitNode) Start(t testing.TB) {
	t.Helper()
	if err := r.start(filepath.Join(rabbitBinDir, "rabbitmq-server")); err != nil {
		t.Fatalf("testenv: rabbitmq start: %v", err)
	}
}

// Stop stops the node as a service manager does: SIGTERM to rabbitmq-server,
// whose script passes it to the VM, which stops the rabbit application in
// order (init:stop) and exits. Clients see their connections closed
// (connection.close 320 CONNECTION_FORCED); durable queues and their persistent
// messages survive. It waits for the process and, as a last resort, kills the
// process group. (rabbitmqctl stop does the same, after booting a VM of its
// own: 3 CPU-s and up to 14 s on a loaded machine, before the outage starts.)
// The node stays stopped until Start or the next RabbitMQ call. No-op if not
// running.
func (r *RabbitNode) Stop(t testing.TB) {
	t.Helper()
	if err := r.stop(); err != nil {
		t.Fatalf("testenv: rabbitmq stop: %v", err)
	}
}

func (r *RabbitNode) stop() error {
	r.mu.Lock()
	proc := r.proc
	r.mu.Unlock()
	if proc == nil || proc.exited() {
		return nil
	}
	_ = proc.cmd.Process.Signal(syscall.SIGTERM)
	if proc.waitExit(30 * time.Second) {
		return nil
	}
	// The VM hangs: SIGKILL the whole group (script, beam.smp, erl_child_setup).
	killGroup(proc.cmd.Process.Pid, syscall.SIGKILL)
	if !proc.waitExit(15 * time.Second) {
		return fmt.Errorf("rabbitmq-server (pid %d) survived SIGTERM and SIGKILL", proc.cmd.Process.Pid)
	}
	return fmt.Errorf("rabbitmq-server (pid %d) did not stop within 30 s of SIGTERM (process group killed); %s", proc.cmd.Process.Pid, r.logs())
}

// Ctl runs rabbitmqctl -n NODE args... against the node (e.g. "list_queues",
// "name", "messages") and returns its combined output; it fails the test on error.
func (r *RabbitNode) Ctl(t testing.TB, args ...string) string {
	t.Helper()
	out, err := r.ctl(60*time.Second, args...)
	if err != nil {
		t.Fatalf("testenv: rabbitmqctl %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return out
}

func (r *RabbitNode) ctl(timeout time.Duration, args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, filepath.Join(rabbitBinDir, "rabbitmqctl"), append([]string{"-n", r.Node}, args...)...)
	cmd.Dir = r.Dir
	cmd.Env = r.env
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// shutdown stops the node and its epmd, removes its dir and releases its ports.
// Used by Main; safe to call more than once.
func (r *RabbitNode) shutdown() error {
	var err error
	r.stopOnce.Do(func() {
		err = r.stop()
		if r.epmd != nil && !r.epmd.exited() {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			kill := exec.CommandContext(ctx, r.epmd.cmd.Path, "-port", strconv.Itoa(r.EPMDPort), "-kill")
			kill.Env = r.env
			_ = kill.Run()
			cancel()
			if !r.epmd.waitExit(5 * time.Second) {
				_ = r.epmd.cmd.Process.Kill()
				r.epmd.waitExit(5 * time.Second)
			}
		}
		if rmErr := os.RemoveAll(r.Dir); rmErr != nil && err == nil {
			err = rmErr
		}
		r.release()
	})
	return err
}

// AddUser creates the user name with password and full permissions on the vhost
// "/" (when it exists already, it sets its password). Users outlive the test, like
// everything on the shared node: use names of your own. Each call runs rabbitmqctl
// once (about a second, more on a loaded machine).
func (r *RabbitNode) AddUser(t testing.TB, name, password string) {
	t.Helper()
	r.evalUser(t, name, "case "+addUser+" of\n"+
		"  ok -> ok;\n"+
		"  exists -> ok = rabbit_auth_backend_internal:change_password(N, P, A)\n"+
		"end", password)
}

// ExternalUser makes sure that the user SASL EXTERNAL logs in as with
// Certs.ClientCert exists (named after its common name, RabbitClientCN, without a
// password, with full permissions on "/"), and returns its name. The first call
// creates it.
func (r *RabbitNode) ExternalUser(t testing.TB) string {
	t.Helper()
	r.usersMu.Lock()
	defer r.usersMu.Unlock()
	if !r.external {
		var b [16]byte
		_, _ = rand.Read(b[:])
		r.evalUser(t, RabbitClientCN, "ok = case "+addUser+" of exists -> ok; R -> R end,\n"+
			"ok = rabbit_auth_backend_internal:clear_password(N, A)", hex.EncodeToString(b[:]))
		r.external = true
	}
	return RabbitClientCN
}

// addUser is an Erlang expression that creates user N with password P, acting
// user A, and is ok, or exists when the user exists: RabbitMQ 3.10 raises that
// rather than returning it (seen: a bare case on the result failed); the
// clauses take each form it could have.
const addUser = "try rabbit_auth_backend_internal:add_user(N, P, A) of\n" +
	"  ok -> ok;\n" +
	"  {error, {user_already_exists, _}} -> exists\n" +
	"catch\n" +
	"  throw:{error, {user_already_exists, _}} -> exists;\n" +
	"  exit:{user_already_exists, _} -> exists;\n" +
	"  error:{user_already_exists, _} -> exists\n" +
	"end"

// evalUser runs create (Erlang, with N the user's name, P the password and A
// the acting user bound) on the node, then gives the user full permissions on
// "/", in one rabbitmqctl eval: each rabbitmqctl call boots a VM of its own
// (2-3 CPU-s, up to 15 s on a loaded machine), and add_user, set_permissions
// and clear_password took one each.
func (r *RabbitNode) evalUser(t testing.TB, name, create, password string) {
	t.Helper()
	expr := fmt.Sprintf("N = %s, P = %s, A = <<\"testenv\">>,\n%s,\n"+
		"ok = rabbit_auth_backend_internal:set_permissions(N, <<\"/\">>, <<\".*\">>, <<\".*\">>, <<\".*\">>, A),\nok.",
		erlBinary(name), erlBinary(password), create)
	// The expression's value, ok, is a line of its own; the node's warnings
	// (such as "the user already exists") come before or after it,
	// forwarded as they are logged. A crash of the expression is an error.
	out, err := r.ctl(60*time.Second, "eval", expr)
	if err != nil || !slices.Contains(strings.Split(out, "\n"), "ok") {
		t.Fatalf("testenv: rabbitmqctl eval (user %s): %v\n%s", name, err, out)
	}
}

// erlBinary is s as an Erlang binary of its bytes, <<104,105>>: no quoting to
// get wrong.
func erlBinary(s string) string {
	var b strings.Builder
	b.WriteString("<<")
	for i := 0; i < len(s); i++ {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(strconv.Itoa(int(s[i])))
	}
	b.WriteString(">>")
	return b.String()
}

// nodeCerts generates the node's PKI in dir with NewCerts, which wants a
// testing.TB: certTB gives it dir as its temp dir and turns its Fatalf into an
// error. The files live as long as the node's dir, not as a test's.
func nodeCerts(dir string) (c *Certs, err error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	defer func() {
		if v := recover(); v != nil {
			if f, ok := v.(certFatal); ok {
				err = fmt.Errorf("certificates: %s", string(f))
				return
			}
			err = fmt.Errorf("certificates: %v", v)
		}
	}()
	return NewCerts(certTB{dir: dir}, RabbitClientCN), nil
}

type certFatal string

// certTB is the testing.TB NewCerts runs with outside a test. Only the methods
// NewCerts uses are implemented; any other panics (the nil embedded TB) and
// nodeCerts reports it.
type certTB struct {
	testing.TB
	dir string
}

func (certTB) Helper()                           {}
func (c certTB) TempDir() string                 { return c.dir }
func (certTB) Fatalf(format string, args ...any) { panic(certFatal(fmt.Sprintf(format, args...))) }
func (certTB) Fatal(args ...any)                 { panic(certFatal(fmt.Sprint(args...))) }
