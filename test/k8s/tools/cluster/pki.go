package main

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"time"
)

// certAuthority is a CA's certificate and key, kept to sign leaves.
type certAuthority struct {
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
}

// leaf describes one certificate the cluster's components present.
type leaf struct {
	file   string // pki/<file>.crt and .key
	cn     string
	orgs   []string
	server bool
	dns    []string
	ips    []string
}

// makePKI writes the cluster's CAs, certificates, service-account keys
// and kubeconfigs into pki/. Every identity is the one Kubernetes' default
// RBAC and the Node authorizer expect (system:node:<name>, system:kube-*),
// except the admin, who is in system:masters.
func makePKI(e env) error {
	dir := e.path("pki")
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	ca, err := newCA(dir, "ca", "puzzleq-test-ca")
	if err != nil {
		return err
	}
	front, err := newCA(dir, "front-proxy-ca", "puzzleq-test-front-proxy-ca")
	if err != nil {
		return err
	}
	leaves := []leaf{
		{file: "apiserver", cn: "kube-apiserver", server: true,
			dns: []string{"kubernetes", "kubernetes.default", "kubernetes.default.svc", "kubernetes.default.svc.cluster.local", "localhost"},
			ips: []string{nodeIP, kubeSvcIP, "127.0.0.1"}},
		{file: "apiserver-kubelet-client", cn: "kube-apiserver-kubelet-client", orgs: []string{"system:masters"}},
		{file: "admin", cn: "puzzleq-test-admin", orgs: []string{"system:masters"}},
		{file: "kubelet", cn: "system:node:" + nodeName, orgs: []string{"system:nodes"}},
		{file: "controller-manager", cn: "system:kube-controller-manager"},
		{file: "scheduler", cn: "system:kube-scheduler"},
		{file: "kube-proxy", cn: "system:kube-proxy"},
	}
	for _, l := range leaves {
		if err := ca.sign(dir, l); err != nil {
			return err
		}
	}
	if err := front.sign(dir, leaf{file: "front-proxy-client", cn: "front-proxy-client"}); err != nil {
		return err
	}
	// The service-account token signing key.
	sa, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return err
	}
	if err := writeKey(filepath.Join(dir, "sa.key"), sa); err != nil {
		return err
	}
	pub, err := x509.MarshalPKIXPublicKey(&sa.PublicKey)
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, "sa.pub"), pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: pub}), 0o600); err != nil {
		return err
	}
	for _, name := range []string{"admin", "kubelet", "controller-manager", "scheduler", "kube-proxy"} {
		if err := writeKubeconfig(e, name); err != nil {
			return err
		}
	}
	return nil
}

func writeKubeconfig(e env, name string) error {
	cfg := fmt.Sprintf(`apiVersion: v1
kind: Config
clusters:
- name: puzzleq-test
  cluster:
    certificate-authority: %s
    server: https://%s:%s
users:
- name: %s
  user:
    client-certificate: %s
    client-key: %s
contexts:
- name: puzzleq-test
  context: {cluster: puzzleq-test, user: %s}
current-context: puzzleq-test
`, e.pki("ca.crt"), nodeIP, apiPort, name, e.pki(name+".crt"), e.pki(name+".key"), name)
	return os.WriteFile(e.pki(name+".kubeconfig"), []byte(cfg), 0o600)
}

func newCA(dir, file, cn string) (*certAuthority, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	tmpl := &x509.Certificate{
		SerialNumber:          serial(),
		Subject:               pkix.Name{CommonName: cn},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(7 * 24 * time.Hour),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature | x509.KeyUsageKeyEncipherment,
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, err
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, err
	}
	if err := writeCert(filepath.Join(dir, file+".crt"), der); err != nil {
		return nil, err
	}
	if err := writeKey(filepath.Join(dir, file+".key"), key); err != nil {
		return nil, err
	}
	return &certAuthority{cert: cert, key: key}, nil
}

func (ca *certAuthority) sign(dir string, l leaf) error {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return err
	}
	tmpl := &x509.Certificate{
		SerialNumber: serial(),
		Subject:      pkix.Name{CommonName: l.cn, Organization: l.orgs},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(7 * 24 * time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature | x509.KeyUsageKeyEncipherment,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
		DNSNames:     l.dns,
	}
	if l.server {
		tmpl.ExtKeyUsage = append(tmpl.ExtKeyUsage, x509.ExtKeyUsageServerAuth)
	}
	for _, ip := range l.ips {
		tmpl.IPAddresses = append(tmpl.IPAddresses, net.ParseIP(ip))
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &key.PublicKey, ca.key)
	if err != nil {
		return err
	}
	if err := writeCert(filepath.Join(dir, l.file+".crt"), der); err != nil {
		return err
	}
	return writeKey(filepath.Join(dir, l.file+".key"), key)
}

func serial() *big.Int {
	n, _ := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 62))
	return n
}

func writeCert(path string, der []byte) error {
	return os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o644)
}

func writeKey(path string, key *ecdsa.PrivateKey) error {
	der, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return err
	}
	return os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: der}), 0o600)
}
