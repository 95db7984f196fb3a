package store

import (
	"context"
	"errors"
	"fmt"

	"github.com/redis/go-redis/v9"
)

// allScripts is every Lua script of the store, for LoadScripts. A script
// left out still works, but after a Redis restart its first call is sent
// twice, the second time whole (for a batch, the whole batch); a test
// holds this list against the package's redis.NewScript variables.
var allScripts = []*redis.Script{
	submitScript, submitHitScript, startManyScript, finishManyScript,
	pendingScript, releaseScript, releaseClaimScript,
	progressScript,
	leaseScript, reapScript,
	commitBatchScript, abandonCommitScript, feedScript, enqueueFedScript, startUnitScript, finishUnitScript, finishChunkScript,
	cancelItemsScript, markCanceledScript, itemProgressScript, readItemsScript, itemRequestScript, entryHeadsScript,
	admitScript, renewSolveScript, finishSolveScript, releaseSolveScript, cancelSolveScript,
	admitSlotScript, renewSlotScript, releaseSlotScript, passSlotScript, yieldUnitScript, registerSlotsScript,
	beginRetryScript, retryChunkScript,
	createSessionScript, keyEpochScript,
	webhookBacklogScript,
	addHistoryScript,
	setBatchTraceScript,
	deleteBatchScript, deleteTaskScript,
}

// LoadScripts makes sure Redis has every script of the store cached, so
// their calls go as EVALSHA with the digest alone. Without it, the first
// call of each script after Redis restarted (or flushed its script cache)
// fails with NOSCRIPT and is resent as EVAL with the whole script and
// arguments, which for a batch is its whole body again. It asks which
// scripts are missing in one round trip and loads only those. c is a
// client, or one connection (see LoadScriptsOnConnect).
func LoadScripts(ctx context.Context, c redis.Scripter) error {
	hashes := make([]string, len(allScripts))
	for i, sc := range allScripts {
		hashes[i] = sc.Hash()
	}
	have, err := c.ScriptExists(ctx, hashes...).Result()
	if err != nil {
		return fmt.Errorf("store: look up cached scripts: %w", err)
	}
	for i, ok := range have {
		if ok || i >= len(allScripts) {
			continue
		}
		if err := allScripts[i].Load(ctx, c).Err(); err != nil {
			return fmt.Errorf("store: load script: %w", err)
		}
	}
	return nil
}

// LoadScriptsOnConnect is a go-redis Options.OnConnect hook: go-redis runs
// it on every new connection before the connection's first command, and
// a restarted Redis is only reached through new connections, so the
// scripts are cached again before any of them is called. It costs one
// SCRIPT EXISTS per new connection. An error Redis answers (say, an ACL
// that denies SCRIPT) is ignored, since the scripts still run, only by
// EVAL; any other error means the connection is unusable and is returned,
// which makes go-redis drop it.
func LoadScriptsOnConnect(ctx context.Context, cn *redis.Conn) error {
	err := LoadScripts(ctx, cn)
	var rerr redis.Error
	if err != nil && !errors.As(err, &rerr) {
		return err
	}
	return nil
}

// LoadScripts caches every script of the store in its Redis; see the
// package function LoadScripts. The API and the worker call it at start.
func (s *Store) LoadScripts(ctx context.Context) error { return LoadScripts(ctx, s.rdb) }
