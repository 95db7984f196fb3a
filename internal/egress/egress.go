// Package egress holds the rules on where puzzleq's completion webhooks
// may point (Policy, checked when a task or batch is submitted and again
// on every connection, against DNS rebinding) and the HTTP client that
// delivers them within those rules. Their signature is package webhook's.
//
// A webhook URL is a request the server makes on a caller's behalf, so
// it must not reach what the caller could not (SSRF): an address that is
// loopback, private, link-local or otherwise not public is refused
// unless WEBHOOK_ALLOWED_HOSTS names it. SECURITY.md states the rules.
package egress

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// MaxURLBytes bounds a webhook URL.
const MaxURLBytes = 2048

// Policy says which hosts a webhook may reach. The zero Policy allows
// public addresses only.
type Policy struct {
	hosts map[string]bool // host names and IP literals, lowercase
	nets  []netip.Prefix
}

// ParsePolicy reads WEBHOOK_ALLOWED_HOSTS: a comma-separated list of host
// names, IP addresses and CIDR prefixes that webhooks may reach although
// they are not public. A listed host name is allowed whatever it resolves
// to (so list only names whose DNS you control); an address or prefix
// allows connections to those addresses under any name.
func ParsePolicy(list string) (*Policy, error) {
	p := &Policy{hosts: map[string]bool{}}
	for _, e := range strings.Split(list, ",") {
		e = strings.ToLower(strings.TrimSpace(e))
		if e == "" {
			continue
		}
		if strings.Contains(e, "/") {
			pf, err := netip.ParsePrefix(e)
			if err != nil {
				return nil, fmt.Errorf("%q is not a CIDR prefix: %v", e, err)
			}
			p.nets = append(p.nets, pf.Masked())
			continue
		}
		e = strings.Trim(e, "[]")
		if a, err := netip.ParseAddr(e); err == nil {
			a = a.Unmap()
			p.nets = append(p.nets, netip.PrefixFrom(a, a.BitLen()))
		} else if strings.Trim(e, "abcdefghijklmnopqrstuvwxyz0123456789-.") != "" {
			return nil, fmt.Errorf("%q is not a host name, address or prefix", e)
		}
		p.hosts[e] = true
	}
	return p, nil
}

// notPublic are the special-purpose ranges (RFC 6890 and later) that
// netip's predicates do not cover and that no webhook needs: "this
// network", shared address space (carrier NAT), IETF protocol
// assignments, benchmarking, reserved, and the IPv6 translation and
// tunnelling prefixes that can embed a private IPv4 address.
var notPublic = []netip.Prefix{
	netip.MustParsePrefix("0.0.0.0/8"),
	netip.MustParsePrefix("100.64.0.0/10"),
	netip.MustParsePrefix("192.0.0.0/24"),
	netip.MustParsePrefix("192.0.2.0/24"),
	netip.MustParsePrefix("192.88.99.0/24"),
	netip.MustParsePrefix("198.18.0.0/15"),
	netip.MustParsePrefix("198.51.100.0/24"),
	netip.MustParsePrefix("203.0.113.0/24"),
	netip.MustParsePrefix("240.0.0.0/4"),
	netip.MustParsePrefix("64:ff9b::/96"),
	netip.MustParsePrefix("64:ff9b:1::/48"),
	netip.MustParsePrefix("100::/64"),
	netip.MustParsePrefix("2001::/32"),
	netip.MustParsePrefix("2001:db8::/32"),
	netip.MustParsePrefix("2002::/16"),
}

// globalV6 is the IPv6 global unicast space IANA allocates from. netip
// calls every other non-special IPv6 address global unicast too, which
// let IPv4-compatible (::10.0.0.1), IPv4-translated (::ffff:0:10.0.0.1)
// and site-local (fec0::/10) addresses through: none is public.
var globalV6 = netip.MustParsePrefix("2000::/3")

// Public reports whether a is an ordinary public unicast address.
func Public(a netip.Addr) bool {
	a = a.Unmap()
	if a.Is6() && !globalV6.Contains(a) {
		return false
	}
	if !a.IsValid() || !a.IsGlobalUnicast() || a.IsPrivate() || a.IsLoopback() || a.IsLinkLocalUnicast() ||
		a.IsMulticast() || a.IsUnspecified() || a.IsInterfaceLocalMulticast() || a.IsLinkLocalMulticast() {
		return false
	}
	for _, p := range notPublic {
		if p.Contains(a) {
			return false
		}
	}
	return true
}

// allowed reports whether a connection to a for the URL host host may be
// made.
func (p *Policy) allowed(host string, a netip.Addr) bool {
	a = a.Unmap()
	if Public(a) || p.hosts[strings.ToLower(host)] {
		return true
	}
	for _, n := range p.nets {
		if n.Contains(a) {
			return true
		}
	}
	return false
}

// ErrRefused marks a webhook URL or connection that the policy refuses.
var ErrRefused = errors.New("webhook: address not allowed")

// Resolver looks host names up; *net.Resolver satisfies it.
type Resolver interface {
	LookupNetIP(ctx context.Context, network, host string) ([]netip.Addr, error)
}

// CheckURL checks a webhook URL when it is submitted: http or https, a
// host, no credentials, at most MaxURLBytes, and every address its host
// resolves to allowed. The error says what is wrong, for a 400.
func (p *Policy) CheckURL(ctx context.Context, r Resolver, raw string) error {
	if len(raw) > MaxURLBytes {
		return fmt.Errorf("webhook is at most %d bytes", MaxURLBytes)
	}
	u, err := url.Parse(raw)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || u.Opaque != "" {
		return errors.New("webhook must be an absolute http or https URL")
	}
	if u.User != nil {
		return errors.New("webhook must not carry credentials in its URL")
	}
	if u.Fragment != "" {
		return errors.New("webhook must not have a fragment")
	}
	host := u.Hostname()
	if port := u.Port(); port != "" {
		if n, err := strconv.Atoi(port); err != nil || n < 1 || n > 65535 {
			return errors.New("webhook has a bad port")
		}
	}
	if p.hosts[strings.ToLower(host)] {
		return nil
	}
	if a, err := netip.ParseAddr(host); err == nil {
		if !p.allowed(host, a) {
			return fmt.Errorf("webhook host %s is not a public address (see WEBHOOK_ALLOWED_HOSTS): %w", host, ErrRefused)
		}
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	addrs, err := r.LookupNetIP(ctx, "ip", host)
	if err != nil || len(addrs) == 0 {
		return fmt.Errorf("webhook host %q does not resolve", truncate(host, 100))
	}
	for _, a := range addrs {
		if !p.allowed(host, a) {
			return fmt.Errorf("webhook host %q resolves to %s, which is not a public address (see WEBHOOK_ALLOWED_HOSTS): %w",
				truncate(host, 100), a, ErrRefused)
		}
	}
	return nil
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "..."
}

type hostKey struct{}

// Client returns the HTTP client that delivers webhooks: every
// connection's address is checked as it is dialed (whatever DNS answered
// at submission), no proxy is used (it would hide the address), no
// redirect is followed (a 3xx is a failed attempt), and each attempt is
// bounded by timeout.
func (p *Policy) Client(timeout time.Duration) *http.Client {
	d := &net.Dialer{
		Timeout: timeout,
		ControlContext: func(ctx context.Context, network, address string, _ syscall.RawConn) error {
			ap, err := netip.ParseAddrPort(address)
			if err != nil {
				return fmt.Errorf("webhook: dial %s: %w", address, ErrRefused)
			}
			host, _ := ctx.Value(hostKey{}).(string)
			if !p.allowed(host, ap.Addr()) {
				return fmt.Errorf("webhook: %s resolved to %s, not a public address: %w", host, ap.Addr(), ErrRefused)
			}
			return nil
		},
	}
	tr := &http.Transport{
		Proxy: nil,
		DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
			host, _, err := net.SplitHostPort(addr)
			if err != nil {
				return nil, err
			}
			return d.DialContext(context.WithValue(ctx, hostKey{}, host), network, addr)
		},
		TLSHandshakeTimeout:    timeout,
		ResponseHeaderTimeout:  timeout,
		MaxIdleConnsPerHost:    2,
		IdleConnTimeout:        30 * time.Second,
		MaxResponseHeaderBytes: 16 << 10,
	}
	return &http.Client{
		Transport: tr,
		Timeout:   timeout,
		CheckRedirect: func(*http.Request, []*http.Request) error {
			return http.ErrUseLastResponse
		},
	}
}

// MaxResponseBytes is how much of a webhook's answer is read (and
// thrown away, so the connection can be reused); the rest is not.
const MaxResponseBytes = 4 << 10
