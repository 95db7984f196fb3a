package api

import (
	"encoding/json"
	"fmt"
	"net/http"

	"github.com/gin-gonic/gin"

	"github.com/puzzleq/puzzleq/apitype"
)

// getTaskPuzzle answers GET /v1/tasks/{id}/puzzle: what a batch item was
// asked to solve, which the dashboard draws beside its answer. A batch
// keeps its items' requests as long as it lives; a single task's request
// travels in its queue message only, so a single task answers 404 saying
// so (after the same ownership check as a read of the task).
func (s *Server) getTaskPuzzle(c *gin.Context) {
	id := c.Param("id")
	batchID, index, ok := apitype.ParseItemID(id)
	if !ok {
		if _, err := s.loadTask(c); err != nil {
			fail(c, err)
			return
		}
		fail(c, newError(http.StatusNotFound, apitype.CodeNotFound, "",
			"a single task's puzzle is not kept once it is queued; a batch item's is"))
		return
	}
	b, _, err := s.loadItem(c, batchID, index)
	if err != nil {
		fail(c, err)
		return
	}
	raw, err := s.store.ItemRequest(c.Request.Context(), b, index)
	if err != nil {
		fail(c, err)
		return
	}
	var req struct {
		Kind    string          `json:"kind"`
		Puzzle  json.RawMessage `json:"puzzle"`
		Options json.RawMessage `json:"options"`
	}
	if err := json.Unmarshal(raw, &req); err != nil {
		// Written by this server's own encoder at submission.
		fail(c, fmt.Errorf("item %s: stored request: %w", id, err))
		return
	}
	if len(req.Options) == 0 {
		req.Options = json.RawMessage("{}")
	}
	c.JSON(http.StatusOK, apitype.TaskPuzzle{ID: id, Kind: req.Kind, Puzzle: req.Puzzle, Options: req.Options})
}
