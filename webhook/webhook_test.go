package webhook

import (
	"net/http"
	"testing"
	"time"
)

// The Standard Webhooks specification's own example: its secret, message,
// timestamp and body, and the signature every implementation must give.
func TestSignMatchesTheSpecification(t *testing.T) {
	s, err := ParseSecret("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw")
	if err != nil {
		t.Fatal(err)
	}
	got := s.Sign("msg_p5jXN8AQM9LWM0D4loKWxJek", 1614265330, []byte(`{"test": 2432232314}`))
	if want := "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE="; got != want {
		t.Errorf("signature %s, want %s", got, want)
	}
}

func TestVerify(t *testing.T) {
	const secret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
	s, _ := ParseSecret(secret)
	now := time.Unix(1700000000, 0)
	body := []byte(`{"type":"batch.done"}`)
	h := http.Header{}
	h.Set("webhook-id", "msg_1")
	h.Set("webhook-timestamp", "1700000000")
	h.Set("webhook-signature", "v1,bogus "+s.Sign("msg_1", now.Unix(), body))
	if err := Verify(secret, h, body, now); err != nil {
		t.Errorf("a good signature among others: %v", err)
	}
	for name, c := range map[string]struct {
		body []byte
		now  time.Time
	}{
		"another body": {[]byte(`{"type":"task.done"}`), now},
		"too old":      {body, now.Add(Tolerance + time.Second)},
	} {
		if err := Verify(secret, h, c.body, c.now); err == nil {
			t.Errorf("%s: verified", name)
		}
	}
}

func TestParseSecret(t *testing.T) {
	for _, bad := range []string{"", "secret", "whsec_", "whsec_!!!", "whsec_c2hvcnQ="} {
		if _, err := ParseSecret(bad); err == nil {
			t.Errorf("ParseSecret(%q) accepted", bad)
		}
	}
}
