package agent

import (
	"fmt"
	"os"

	"github.com/creack/pty"

	"github.com/cella-sandbox/cella/internal/envd/process"
)

// openPTY opens a pty pair sized as requested. The master stays in the
// agent; the slave becomes the child's stdin, stdout, stderr and
// controlling terminal (Setsid + Setctty).
func openPTY(req *process.PTY) (ptmx, tty *os.File, err error) {
	ptmx, tty, err = pty.Open()
	if err != nil {
		return nil, nil, err
	}
	if size := req.GetSize(); size != nil && size.GetCols() > 0 && size.GetRows() > 0 {
		if err := pty.Setsize(ptmx, &pty.Winsize{Cols: uint16(size.GetCols()), Rows: uint16(size.GetRows())}); err != nil {
			ptmx.Close()
			tty.Close()
			return nil, nil, fmt.Errorf("set pty size: %w", err)
		}
	}
	return ptmx, tty, nil
}

// resize changes the window size of a PTY process; the kernel sends
// SIGWINCH to its foreground process group.
func (p *proc) resize(size *process.PTY_Size) error {
	if p.ptmx == nil {
		return fmt.Errorf("process %d has no pty", p.pid)
	}
	if size == nil || size.GetCols() == 0 || size.GetRows() == 0 {
		return fmt.Errorf("pty size must have non-zero cols and rows")
	}
	p.inputMu.Lock()
	defer p.inputMu.Unlock()
	return pty.Setsize(p.ptmx, &pty.Winsize{Cols: uint16(size.GetCols()), Rows: uint16(size.GetRows())})
}
