module example.com/receiver

go 1.26.8

require github.com/puzzleq/puzzleq v0.0.0

replace github.com/puzzleq/puzzleq => ../../..
