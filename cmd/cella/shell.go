package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"sync"
	"syscall"
	"time"

	"github.com/coder/websocket"
	"github.com/spf13/cobra"
	"golang.org/x/term"

	"github.com/cella-sandbox/cella/internal/client"
)

func newShellCmd() *cobra.Command {
	var o client.PTYOptions
	cmd := &cobra.Command{
		Use:   "shell [flags] ID",
		Short: "Open an interactive shell in a sandbox (PTY over WebSocket; re-attachable)",
		Long: `Open an interactive login shell in a sandbox, with the local terminal in raw
mode: Ctrl-C, window resizes and full-screen programs work as in a local
terminal. If the connection drops, cella re-attaches and replays what the shell
printed meanwhile. The shell keeps running when cella is killed; re-attach with
--session (the id is printed on stderr when the connection is lost).`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := newClient()
			if err != nil {
				return err
			}
			return runShell(cmd.Context(), c, args[0], o, os.Stdin, os.Stdout)
		},
	}
	cmd.Flags().StringVar(&o.Session, "session", "", "re-attach to this shell session instead of starting a new shell")
	cmd.Flags().StringVar(&o.User, "user", "", "user of a new shell (default: the template's user)")
	return cmd
}

// ptyMessage is a server text frame.
type ptyMessage struct {
	Type     string `json:"type"`
	Session  string `json:"session"`
	PID      int    `json:"pid"`
	Offset   int64  `json:"offset"`
	ExitCode int    `json:"exitCode"`
	Status   string `json:"status"`
	Message  string `json:"message"`
}

func runShell(ctx context.Context, c *client.Client, id string, o client.PTYOptions, in *os.File, out io.Writer) error {
	if ctx == nil {
		ctx = context.Background()
	}
	fd := int(in.Fd())
	isTTY := term.IsTerminal(fd)
	if isTTY {
		if w, h, err := term.GetSize(fd); err == nil {
			o.Cols, o.Rows = w, h
		}
		old, err := term.MakeRaw(fd)
		if err != nil {
			return fmt.Errorf("put the terminal in raw mode: %w", err)
		}
		defer term.Restore(fd, old)
	}

	// Keystrokes go to whichever connection is current; typed before the
	// first connection or during a re-attach, they wait for it.
	var mu sync.Mutex
	connected := sync.NewCond(&mu)
	var cur *websocket.Conn
	send := func(typ websocket.MessageType, b []byte) {
		mu.Lock()
		for cur == nil && ctx.Err() == nil {
			connected.Wait()
		}
		conn := cur
		mu.Unlock()
		if conn != nil {
			wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
			_ = conn.Write(wctx, typ, b)
			cancel()
		}
	}
	go func() {
		buf := make([]byte, 32<<10)
		for {
			n, err := in.Read(buf)
			if n > 0 {
				send(websocket.MessageBinary, append([]byte(nil), buf[:n]...))
			}
			if err != nil {
				// End of input: end the shell the way a terminal does.
				send(websocket.MessageBinary, []byte{4})
				return
			}
		}
	}()
	if isTTY {
		winch := make(chan os.Signal, 1)
		signal.Notify(winch, syscall.SIGWINCH)
		defer signal.Stop(winch)
		go func() {
			for range winch {
				if w, h, err := term.GetSize(fd); err == nil {
					b, _ := json.Marshal(map[string]any{"type": "resize", "cols": w, "rows": h})
					send(websocket.MessageText, b)
				}
			}
		}()
	}

	var session string
	var offset int64
	retryUntil := time.Time{}
	for {
		opts := o
		if session != "" {
			opts.Session, opts.Offset = session, offset
			if isTTY {
				if w, h, err := term.GetSize(fd); err == nil {
					opts.Cols, opts.Rows = w, h
				}
			}
		}
		conn, err := c.DialPTY(ctx, id, opts)
		if err != nil {
			var ae *client.APIError
			if session == "" || errors.As(err, &ae) && ae.Status < 500 || time.Now().After(retryUntil) {
				if session != "" {
					return fmt.Errorf("re-attach to shell session %s: %w", session, err)
				}
				return err
			}
			time.Sleep(500 * time.Millisecond)
			continue
		}
		mu.Lock()
		cur = conn
		connected.Broadcast()
		mu.Unlock()
		if session != "" && isTTY {
			if w, h, err := term.GetSize(fd); err == nil {
				b, _ := json.Marshal(map[string]any{"type": "resize", "cols": w, "rows": h})
				send(websocket.MessageText, b)
			}
		}
		exit, err := pumpShell(ctx, conn, out, &session, &offset)
		mu.Lock()
		cur = nil
		mu.Unlock()
		conn.CloseNow()
		if exit != nil {
			if exit.ExitCode != 0 {
				return &exitError{code: exit.ExitCode & 0xff}
			}
			return nil
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		// The connection dropped: re-attach and replay from where we were.
		if session == "" {
			return fmt.Errorf("lost the shell: %v", err)
		}
		fmt.Fprintf(os.Stderr, "\r\ncella: connection lost (%v); re-attaching to session %s\r\n", err, session)
		retryUntil = time.Now().Add(30 * time.Second)
	}
}

// pumpShell copies output until the shell exits (returns its exit message)
// or the connection ends (returns the error).
func pumpShell(ctx context.Context, conn *websocket.Conn, out io.Writer, session *string, offset *int64) (*ptyMessage, error) {
	for {
		typ, data, err := conn.Read(ctx)
		if err != nil {
			return nil, err
		}
		if typ == websocket.MessageBinary {
			*offset += int64(len(data))
			if _, err := out.Write(data); err != nil {
				return nil, err
			}
			continue
		}
		var m ptyMessage
		if json.Unmarshal(data, &m) != nil {
			continue
		}
		switch m.Type {
		case "session":
			*session, *offset = m.Session, m.Offset
		case "exit":
			return &m, nil
		case "error":
			fmt.Fprintf(os.Stderr, "\r\ncella: %s\r\n", m.Message)
		}
	}
}
