package egress

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strings"
	"testing"
	"time"
)

func TestPublic(t *testing.T) {
	for addr, want := range map[string]bool{
		"93.184.216.34": true, "2606:2800:220:1:248:1893:25c8:1946": true,
		"127.0.0.1": false, "10.1.2.3": false, "172.16.0.1": false, "192.168.1.1": false,
		"169.254.169.254": false, "100.64.0.1": false, "0.0.0.0": false, "::1": false, "::": false,
		"fe80::1": false, "fc00::1": false, "::ffff:10.0.0.1": false, "::ffff:127.0.0.1": false,
		"64:ff9b::a00:1": false, "2002:a00:1::": false, "224.0.0.1": false, "255.255.255.255": false,
		// Found by trying (SECURITY.md): netip calls these global unicast.
		"::127.0.0.1": false, "::a00:1": false, "::ffff:0:127.0.0.1": false, "::ffff:0:a00:1": false,
		"fec0::1": false, "5f00::1": false, "192.88.99.1": false, "::ffff:169.254.169.254": false,
		"2001:4860:4860::8888": true, "8.8.8.8": true,
	} {
		if got := Public(netip.MustParseAddr(addr)); got != want {
			t.Errorf("Public(%s) = %v, want %v", addr, got, want)
		}
	}
}

// fakeResolver answers from a table, as a DNS server under the caller's
// control would.
type fakeResolver map[string][]netip.Addr

func (f fakeResolver) LookupNetIP(_ context.Context, _, host string) ([]netip.Addr, error) {
	if a, ok := f[host]; ok {
		return a, nil
	}
	return nil, errors.New("no such host")
}

func TestCheckURL(t *testing.T) {
	r := fakeResolver{
		"public.example":   {netip.MustParseAddr("93.184.216.34")},
		"internal.example": {netip.MustParseAddr("10.0.0.7")},
		"mixed.example":    {netip.MustParseAddr("93.184.216.34"), netip.MustParseAddr("10.0.0.8")},
		"hooks.internal":   {netip.MustParseAddr("10.9.9.9")},
	}
	p, err := ParsePolicy("hooks.internal, 192.168.5.0/24, 127.0.0.1")
	if err != nil {
		t.Fatal(err)
	}
	for url, ok := range map[string]bool{
		"https://public.example/hook":                               true,
		"http://93.184.216.34:8080/x":                               true,
		"http://hooks.internal/x":                                   true, // listed by name
		"http://192.168.5.20/x":                                     true, // in a listed prefix
		"http://127.0.0.1:9/x":                                      true, // listed address
		"http://internal.example/x":                                 false,
		"http://mixed.example/x":                                    false, // one address not public is enough
		"http://10.0.0.1/x":                                         false,
		"http://[::1]/x":                                            false,
		"http://[::127.0.0.1]/x":                                    false,
		"http://[fec0::1]/x":                                        false,
		"http://[::ffff:169.254.169.254]/x":                         false,
		"http://169.254.169.254/latest":                             false,
		"http://localhost/x":                                        false, // does not resolve here
		"ftp://public.example/x":                                    false,
		"public.example/x":                                          false,
		"https://user:pw@public.example/x":                          false,
		"https://public.example/x#frag":                             false,
		"https://public.example:99999/x":                            false,
		"https://" + strings.Repeat("a", MaxURLBytes) + ".example/": false,
	} {
		err := p.CheckURL(context.Background(), r, url)
		if (err == nil) != ok {
			t.Errorf("CheckURL(%.60s) = %v, want ok %v", url, err, ok)
		}
	}
	if _, err := ParsePolicy("not a host"); err == nil {
		t.Error("a bad WEBHOOK_ALLOWED_HOSTS entry was accepted")
	}
}

// The client checks the address it connects to, whatever was checked at
// submission: a name that resolved to a public address then and to
// loopback now (DNS rebinding) is refused when dialed.
func TestClientRefusesWhatThePolicyRefuses(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(204) }))
	defer srv.Close()
	strict, _ := ParsePolicy("")
	_, err := strict.Client(2*time.Second).Post(srv.URL, "application/json", strings.NewReader("{}"))
	if !errors.Is(err, ErrRefused) {
		t.Errorf("POST to loopback without an allowance: %v, want ErrRefused", err)
	}
	lenient, _ := ParsePolicy("127.0.0.1")
	resp, err := lenient.Client(2*time.Second).Post(srv.URL, "application/json", strings.NewReader("{}"))
	if err != nil || resp.StatusCode != 204 {
		t.Fatalf("POST to an allowed address: %v", err)
	}
	resp.Body.Close()
}

// A redirect is not followed, even to an allowed host: the 3xx is the
// attempt's answer.
func TestClientFollowsNoRedirect(t *testing.T) {
	hit := false
	target := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { hit = true }))
	defer target.Close()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.Redirect(w, r, target.URL, http.StatusTemporaryRedirect)
	}))
	defer srv.Close()
	p, _ := ParsePolicy("127.0.0.1")
	resp, err := p.Client(2*time.Second).Post(srv.URL, "application/json", strings.NewReader("{}"))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusTemporaryRedirect || hit {
		t.Errorf("status %d, redirect followed %v", resp.StatusCode, hit)
	}
}
