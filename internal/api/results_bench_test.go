package api

import (
	"bufio"
	"bytes"
	stdgzip "compress/gzip"
	"fmt"
	"io"
	"testing"

	"github.com/klauspost/compress/gzip"
)

// BenchmarkResultsGzip compares the gzip of /results (klauspost's
// stateless writer behind a gzipBlock buffer, results.go) with
// compress/gzip at BestSpeed on 20,000 result lines written a piece at a
// time, as the stream writes them. Run both in one go and compare:
// B/op is what one stream allocates (its state, since the pieces are
// reused), ratio the compressed size over the plain, and MB/s the CPU
// cost on the API's two cores.
//
//	go test -run '^$' -bench ResultsGzip -benchmem ./internal/api/
func BenchmarkResultsGzip(b *testing.B) {
	var plain bytes.Buffer
	for i := range 20000 {
		fmt.Fprintf(&plain, `{"index":%d,"id":"0123456789abcdef0123456789abcdef-%d","custom_id":null,"state":"completed","result":{"moves":%d,"solvable":true,"path":"DRDRDLLURDRRUL"}}`+"\n", i, i, i%31)
	}
	data := plain.Bytes()
	type flusher interface {
		io.Writer
		Flush() error
	}
	for _, c := range []struct {
		name string
		open func(w io.Writer) (flusher, func() error)
	}{
		{"stateless-64KiB", func(w io.Writer) (flusher, func() error) {
			gz, _ := gzip.NewWriterLevel(w, gzip.StatelessCompression)
			buf := bufio.NewWriterSize(gz, gzipBlock)
			return flushBoth{buf, gz}, func() error { _ = buf.Flush(); return gz.Close() }
		}},
		{"stdlib-bestspeed", func(w io.Writer) (flusher, func() error) {
			gz, _ := stdgzip.NewWriterLevel(w, stdgzip.BestSpeed)
			return gz, gz.Close
		}},
	} {
		b.Run(c.name, func(b *testing.B) {
			var out bytes.Buffer
			b.SetBytes(int64(len(data)))
			b.ReportAllocs()
			for b.Loop() {
				out.Reset()
				w, closeFn := c.open(&out)
				for off := 0; off < len(data); {
					// Lines one by one, a flush every piece.
					end := min(len(data), off+resultPiece)
					for off < end {
						nl := bytes.IndexByte(data[off:], '\n')
						_, _ = w.Write(data[off : off+nl+1])
						off += nl + 1
					}
					_ = w.Flush()
				}
				_ = closeFn()
			}
			b.ReportMetric(float64(out.Len())/float64(len(data)), "ratio")
		})
	}
}

// flushBoth flushes the block buffer into the gzip writer, then it.
type flushBoth struct {
	*bufio.Writer
	gz *gzip.Writer
}

func (f flushBoth) Flush() error {
	if err := f.Writer.Flush(); err != nil {
		return err
	}
	return f.gz.Flush()
}
