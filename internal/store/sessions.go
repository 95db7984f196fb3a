package store

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/go-redis/redis_rate/v10"
	"github.com/redis/go-redis/v9"
)

// Session is a dashboard session as Redis holds it.
type Session struct {
	// KeyDigest is the hex SHA-256 of the API key it was opened with.
	KeyDigest string
	// KeyName is that key's name when the session was opened: a key
	// renamed is another identity.
	KeyName string
	// Created and Expires are when it was opened and when it ends.
	Created, Expires time.Time
}

// parseSession reads a session as createSessionScript stores it,
// "digest:created:expires:name" with the times in Unix ms; the name goes
// last, so it may hold any byte.
func parseSession(v string) (Session, bool) {
	p := strings.SplitN(v, ":", 4)
	if len(p) != 4 {
		return Session{}, false
	}
	c, err1 := strconv.ParseInt(p[1], 10, 64)
	e, err2 := strconv.ParseInt(p[2], 10, 64)
	if err1 != nil || err2 != nil {
		return Session{}, false
	}
	return Session{KeyDigest: p[0], KeyName: p[3], Created: time.UnixMilli(c), Expires: time.UnixMilli(e)}, true
}

// createSessionScript records a session and caps its key's live sessions.
// The times are Redis's own (TIME), the clock that the key's epoch was
// taken by too.
//
// KEYS[1] the session (keys.session)
// KEYS[2] the key's sessions (keys.keySessions)
// ARGV[1] the key's digest, ARGV[2] its name
// ARGV[3] the session's TTL, ms
// ARGV[4] the most live sessions the key may hold
// ARGV[5] the token digest
//
// Returns {created ms, the token digests of the sessions over the cap,
// oldest first}: they stay in KEYS[2] until EndSessions removes them with
// their records, which this script cannot name in its KEYS.
var createSessionScript = redis.NewScript(`
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local ttl = tonumber(ARGV[3])
redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', now - ttl)
redis.call('SET', KEYS[1], ARGV[1] .. ':' .. now .. ':' .. (now + ttl) .. ':' .. ARGV[2], 'PX', ttl)
redis.call('ZADD', KEYS[2], now, ARGV[5])
redis.call('PEXPIRE', KEYS[2], ttl)
local over = redis.call('ZCARD', KEYS[2]) - tonumber(ARGV[4])
local old = {}
if over > 0 then old = redis.call('ZRANGE', KEYS[2], 0, over - 1) end
return {now, old}
`)

// keyEpochScript gives a key an epoch, now by Redis's clock, unless it has
// one, and records that it has.
//
// KEYS[1] the key's epoch (keys.keyEpoch)
// KEYS[2] the keys with an epoch (keys.sessionKeys)
// ARGV[1] the key's digest
//
// Returns the epoch, Unix ms.
var keyEpochScript = redis.NewScript(`
local e = redis.call('GET', KEYS[1])
if not e then
  local t = redis.call('TIME')
  e = tostring(tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000))
  redis.call('SET', KEYS[1], e)
end
redis.call('SADD', KEYS[2], ARGV[1])
return e
`)

// CreateSession records a dashboard session of the key keyDigest (its hex
// SHA-256; Redis never holds a credential) named tokenDigest (the hex
// SHA-256 of the cookie's token), for ttl, and ends the key's oldest
// sessions past maxPerKey. It returns the session as recorded.
func (s *Store) CreateSession(ctx context.Context, tokenDigest, keyDigest, keyName string, ttl time.Duration, maxPerKey int) (Session, error) {
	res, err := createSessionScript.Run(ctx, s.rdb, []string{s.k.session(tokenDigest), s.k.keySessions(keyDigest)},
		keyDigest, keyName, ttl.Milliseconds(), maxPerKey, tokenDigest).Slice()
	if err != nil {
		return Session{}, fmt.Errorf("store: create session: %w", err)
	}
	now, _ := res[0].(int64)
	var old []string
	if l, ok := res[1].([]any); ok {
		for _, v := range l {
			if t, ok := v.(string); ok {
				old = append(old, t)
			}
		}
	}
	if err := s.endSessions(ctx, keyDigest, old); err != nil {
		return Session{}, err
	}
	return Session{KeyDigest: keyDigest, KeyName: keyName, Created: time.UnixMilli(now), Expires: time.UnixMilli(now + ttl.Milliseconds())}, nil
}

// endSessions removes the sessions tokenDigests of the key keyDigest: their
// records and their places among the key's sessions.
func (s *Store) endSessions(ctx context.Context, keyDigest string, tokenDigests []string) error {
	if len(tokenDigests) == 0 {
		return nil
	}
	_, err := s.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		members := make([]any, len(tokenDigests))
		for i, t := range tokenDigests {
			members[i] = t
			p.Del(ctx, s.k.session(t))
		}
		p.ZRem(ctx, s.k.keySessions(keyDigest), members...)
		return nil
	})
	if err != nil {
		return fmt.Errorf("store: end sessions: %w", err)
	}
	return nil
}

// Session returns the session named tokenDigest, or ErrNotFound when there
// is none (it expired, was signed out or ended, or is not one this
// version of the record reads).
func (s *Store) Session(ctx context.Context, tokenDigest string) (Session, error) {
	v, err := s.rdb.Get(ctx, s.k.session(tokenDigest)).Result()
	if errors.Is(err, redis.Nil) {
		return Session{}, ErrNotFound
	}
	if err != nil {
		return Session{}, fmt.Errorf("store: read session: %w", err)
	}
	ss, ok := parseSession(v)
	if !ok {
		return Session{}, ErrNotFound
	}
	return ss, nil
}

// DeleteSession ends the session named tokenDigest; ending one that does
// not exist is not an error.
func (s *Store) DeleteSession(ctx context.Context, tokenDigest string) error {
	ss, err := s.Session(ctx, tokenDigest)
	if errors.Is(err, ErrNotFound) {
		if err := s.rdb.Del(ctx, s.k.session(tokenDigest)).Err(); err != nil {
			return fmt.Errorf("store: delete session: %w", err)
		}
		return nil
	}
	if err != nil {
		return err
	}
	return s.endSessions(ctx, ss.KeyDigest, []string{tokenDigest})
}

// SessionKeys makes keyDigests (the hex SHA-256 of every configured
// tenant key) the keys that may hold dashboard sessions, and returns each
// one's epoch: a key without one gets one now. Every key that had an
// epoch and is not among keyDigests was removed, so its sessions end and
// its epoch goes: were it added back, it gets a new epoch, and a session
// of its earlier life stays refused.
func (s *Store) SessionKeys(ctx context.Context, keyDigests []string) (map[string]time.Time, error) {
	known, err := s.rdb.SMembers(ctx, s.k.sessionKeys()).Result()
	if err != nil {
		return nil, fmt.Errorf("store: session keys: %w", err)
	}
	want := make(map[string]bool, len(keyDigests))
	for _, d := range keyDigests {
		want[d] = true
	}
	for _, d := range known {
		if want[d] {
			continue
		}
		toks, err := s.rdb.ZRange(ctx, s.k.keySessions(d), 0, -1).Result()
		if err != nil {
			return nil, fmt.Errorf("store: sessions of a removed key: %w", err)
		}
		if err := s.endSessions(ctx, d, toks); err != nil {
			return nil, err
		}
		if _, err := s.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
			p.Del(ctx, s.k.keySessions(d), s.k.keyEpoch(d))
			p.SRem(ctx, s.k.sessionKeys(), d)
			return nil
		}); err != nil {
			return nil, fmt.Errorf("store: end a removed key's sessions: %w", err)
		}
	}
	epochs := make(map[string]time.Time, len(keyDigests))
	for _, d := range keyDigests {
		v, err := keyEpochScript.Run(ctx, s.rdb, []string{s.k.keyEpoch(d), s.k.sessionKeys()}, d).Text()
		if err != nil {
			return nil, fmt.Errorf("store: key epoch: %w", err)
		}
		ms, err := strconv.ParseInt(v, 10, 64)
		if err != nil {
			return nil, fmt.Errorf("store: key epoch %q: %w", v, err)
		}
		epochs[d] = time.UnixMilli(ms)
	}
	return epochs, nil
}

// AllowSignIn counts one dashboard sign-in of who (keys.signIns) against
// perMinute a minute (its burst as well), and reports whether it was
// within them; when not, how long until one more is. Kept in Redis, the
// limit holds across API replicas.
func (s *Store) AllowSignIn(ctx context.Context, who string, perMinute int) (bool, time.Duration, error) {
	res, err := redis_rate.NewLimiter(s.rdb).Allow(ctx, s.k.signIns(who),
		redis_rate.Limit{Rate: perMinute, Burst: perMinute, Period: time.Minute})
	if err != nil {
		return false, 0, fmt.Errorf("store: sign-in limit: %w", err)
	}
	return res.Allowed > 0, res.RetryAfter, nil
}
