package loadgen

import (
	"fmt"
	"io"
	"os"
	"strings"
	"sync"
	"time"

	"golang.org/x/term"
)

// Progress draws a one-line bar on a terminal; on anything else (a file, a
// pipe, CI) it draws nothing.
type Progress struct {
	w     io.Writer
	label string
	total int64
	count func() (done int64, note string)
	start time.Time
	stop  chan struct{}
	wg    sync.WaitGroup
}

// StartProgress starts redrawing every 200 ms while count reports done of
// total; it returns nil (a valid no-op *Progress) when w is not a terminal.
func StartProgress(w *os.File, label string, total int64, count func() (done int64, note string)) *Progress {
	if w == nil || !term.IsTerminal(int(w.Fd())) {
		return nil
	}
	p := &Progress{w: w, label: label, total: max(total, 1), count: count, start: time.Now(), stop: make(chan struct{})}
	p.wg.Add(1)
	go func() {
		defer p.wg.Done()
		t := time.NewTicker(200 * time.Millisecond)
		defer t.Stop()
		for {
			select {
			case <-p.stop:
				p.draw()
				fmt.Fprintln(p.w)
				return
			case <-t.C:
				p.draw()
			}
		}
	}()
	return p
}

func (p *Progress) draw() {
	done, note := p.count()
	const width = 30
	frac := min(float64(done)/float64(p.total), 1)
	filled := int(frac * width)
	bar := strings.Repeat("=", filled) + strings.Repeat(" ", width-filled)
	fmt.Fprintf(p.w, "\r%s [%s] %3.0f%% %d/%d %s %s\x1b[K", p.label, bar, 100*frac, done, p.total,
		time.Since(p.start).Truncate(time.Second), note)
}

// Stop draws the last state and ends the line. Safe on nil.
func (p *Progress) Stop() {
	if p == nil {
		return
	}
	close(p.stop)
	p.wg.Wait()
}
