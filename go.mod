module github.com/puzzleq/puzzleq

go 1.26.8
