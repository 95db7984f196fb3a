package store

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"
)

// CreateSession records a dashboard session for ttl: tokenDigest names it
// (the hex SHA-256 of the cookie's token) and keyDigest is the hex SHA-256
// of the API key it was opened with, so a session ends when its key is
// removed or rotated. Both are digests: Redis never holds a credential.
func (s *Store) CreateSession(ctx context.Context, tokenDigest, keyDigest string, ttl time.Duration) error {
	if err := s.rdb.Set(ctx, s.k.session(tokenDigest), keyDigest, ttl).Err(); err != nil {
		return fmt.Errorf("store: create session: %w", err)
	}
	return nil
}

// Session returns the key digest of the session named tokenDigest, or
// ErrNotFound when there is none (it expired or was signed out).
func (s *Store) Session(ctx context.Context, tokenDigest string) (string, error) {
	v, err := s.rdb.Get(ctx, s.k.session(tokenDigest)).Result()
	if errors.Is(err, redis.Nil) {
		return "", ErrNotFound
	}
	if err != nil {
		return "", fmt.Errorf("store: read session: %w", err)
	}
	return v, nil
}

// DeleteSession ends the session named tokenDigest; ending one that does
// not exist is not an error.
func (s *Store) DeleteSession(ctx context.Context, tokenDigest string) error {
	if err := s.rdb.Del(ctx, s.k.session(tokenDigest)).Err(); err != nil {
		return fmt.Errorf("store: delete session: %w", err)
	}
	return nil
}
