package natsbroker

import (
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nkeys"

	"github.com/delaybridge/delaybridge/internal/testenv"
	"github.com/delaybridge/delaybridge/pkg/config"
)

const password = "nats-pw-7c1d-secret"

func startServer(t *testing.T, opts *server.Options) string {
	t.Helper()
	opts.Host, opts.Port, opts.NoLog, opts.NoSigs = "127.0.0.1", -1, true, true
	ns, err := server.NewServer(opts)
	if err != nil {
		t.Fatal(err)
	}
	go ns.Start()
	if !ns.ReadyForConnections(10 * time.Second) {
		t.Fatal("nats not ready")
	}
	t.Cleanup(ns.Shutdown)
	return ns.ClientURL()
}

func connect(t *testing.T, url string, a Auth) error {
	t.Helper()
	opts, err := AuthOptions(a)
	if err != nil {
		return err
	}
	nc, err := Connect(url, "auth test", slog.New(slog.NewTextHandler(io.Discard, nil)), opts...)
	if err != nil {
		return err
	}
	defer nc.Close()
	return Ready(nc)
}

// Every authentication method against a server that requires it: the right
// credential connects, a wrong one fails with an error that says what to
// check and never contains the secret.
func TestAuthMethods(t *testing.T) {
	dir := t.TempDir()
	userKP, _ := nkeys.CreateUser()
	userPub, _ := userKP.PublicKey()
	seed, _ := userKP.Seed()
	seedFile := filepath.Join(dir, "user.nk")
	writeFile(t, seedFile, seed)
	otherKP, _ := nkeys.CreateUser()
	otherSeed, _ := otherKP.Seed()
	otherSeedFile := filepath.Join(dir, "other.nk")
	writeFile(t, otherSeedFile, otherSeed)

	cases := []struct {
		name   string
		server *server.Options
		good   Auth
		bad    Auth
	}{
		{"user and password", &server.Options{Users: []*server.User{{Username: "db", Password: password}}},
			Auth{User: "db", Password: password}, Auth{User: "db", Password: "wrong"}},
		{"token", &server.Options{Authorization: password},
			Auth{Token: password}, Auth{Token: "wrong"}},
		{"nkey", &server.Options{Nkeys: []*server.NkeyUser{{Nkey: userPub}}},
			Auth{NKeySeedFile: seedFile}, Auth{NKeySeedFile: otherSeedFile}},
		{"creds (JWT)", nil, Auth{}, Auth{}},
	}
	cases[3].server, cases[3].good.CredsFile, cases[3].bad.CredsFile = operatorMode(t, dir)

	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			url := startServer(t, c.server)
			if err := connect(t, url, c.good); err != nil {
				t.Fatalf("right credential: %v", err)
			}
			err := connect(t, url, c.bad)
			if err == nil {
				t.Fatal("wrong credential connected")
			}
			if !strings.Contains(err.Error(), "credentials") && !strings.Contains(strings.ToLower(err.Error()), "authorization") {
				t.Errorf("error does not say what to check: %v", err)
			}
			if strings.Contains(err.Error(), password) {
				t.Errorf("the secret is in the error: %v", err)
			}
			if err := connect(t, url, Auth{}); err == nil {
				t.Error("connected without credentials")
			}
		})
	}
}

// operatorMode configures a server trusting a fresh operator, with one
// account and a user whose .creds file is good; bad is a user signed by
// another account the server does not know.
func operatorMode(t *testing.T, dir string) (*server.Options, string, string) {
	t.Helper()
	okp, _ := nkeys.CreateOperator()
	opub, _ := okp.PublicKey()
	oc := jwt.NewOperatorClaims(opub)
	ojwt, err := oc.Encode(okp)
	if err != nil {
		t.Fatal(err)
	}
	oclaims, _ := jwt.DecodeOperatorClaims(ojwt)
	resolver := &server.MemAccResolver{}
	account := func(register bool) nkeys.KeyPair {
		akp, _ := nkeys.CreateAccount()
		apub, _ := akp.PublicKey()
		ajwt, err := jwt.NewAccountClaims(apub).Encode(okp)
		if err != nil {
			t.Fatal(err)
		}
		if register {
			resolver.Store(apub, ajwt)
		}
		return akp
	}
	creds := func(akp nkeys.KeyPair, name string) string {
		ukp, _ := nkeys.CreateUser()
		upub, _ := ukp.PublicKey()
		ujwt, err := jwt.NewUserClaims(upub).Encode(akp)
		if err != nil {
			t.Fatal(err)
		}
		seed, _ := ukp.Seed()
		data, err := jwt.FormatUserConfig(ujwt, seed)
		if err != nil {
			t.Fatal(err)
		}
		path := filepath.Join(dir, name)
		writeFile(t, path, data)
		return path
	}
	good := creds(account(true), "good.creds")
	bad := creds(account(false), "bad.creds")
	return &server.Options{TrustedOperators: []*jwt.OperatorClaims{oclaims}, AccountResolver: resolver}, good, bad
}

// TLS with a client certificate: verified with the right CA, refused with
// another CA, refused without a client certificate.
func TestMutualTLS(t *testing.T) {
	certs := testenv.NewCerts(t, "delaybridge")
	url := startServer(t, &server.Options{TLS: true, TLSVerify: true, TLSConfig: certs.ServerTLS(t, true)})
	good := Auth{TLS: config.TLS{Enabled: true, CAFile: certs.CAFile, CertFile: certs.ClientCert, KeyFile: certs.ClientKey}}
	if err := connect(t, url, good); err != nil {
		t.Fatalf("mutual TLS: %v", err)
	}
	for name, a := range map[string]Auth{
		"other CA":              {TLS: config.TLS{Enabled: true, CAFile: certs.OtherCAFile, CertFile: certs.ClientCert, KeyFile: certs.ClientKey}},
		"no client certificate": {TLS: config.TLS{Enabled: true, CAFile: certs.CAFile}},
		"no TLS":                {},
	} {
		if err := connect(t, url, a); err == nil {
			t.Errorf("%s: connected", name)
		}
	}
}

func writeFile(t *testing.T, path string, data []byte) {
	t.Helper()
	if err := os.WriteFile(path, data, 0o600); err != nil {
		t.Fatal(err)
	}
}

// A connection whose server went away says so, with the servers it tries
// and what to check, not only nats.go's state.
func TestReadyWhileReconnecting(t *testing.T) {
	ns := testenv.NATS(t)
	nc, err := Connect(ns.URL, "test", slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	if err := Ready(nc); err != nil {
		t.Fatalf("connected: %v", err)
	}
	ns.Shutdown()
	testenv.Eventually(t, 10*time.Second, func() bool { return Ready(nc) != nil }, "the lost connection seen")
	if err := Ready(nc); !strings.Contains(err.Error(), "reconnecting to "+ns.URL) || !strings.Contains(err.Error(), "is the server running") {
		t.Errorf("Ready while reconnecting: %v", err)
	}
}
