package cli

import "github.com/puzzleq/puzzleq/puzzle"

// decodeItem validates one line of an NDJSON batch with the API's own
// item decoder (puzzle.CheckItem), so that puzzlectl refuses exactly
// the lines the API would, with the same messages, before any batch is
// sent. has reports whether the line had a custom_id (the decoder refuses
// an empty one, so "" means none).
func decodeItem(line []byte) (customID string, has bool, err error) {
	customID, err = puzzle.CheckItem(line)
	if err != nil {
		return "", false, err
	}
	return customID, customID != "", nil
}
