// Package childproc holds what the test helpers that run a server as a child
// process (devmongo, ferretdb) share: a bounded tail of its output, an
// exclusive lock so that parallel test binaries build it once, and process
// attributes that make the kernel kill it if the test binary dies without
// running its cleanups; and the reading of its output for the line that says
// where it listens.
package childproc

import (
	"bufio"
	"io"
	"os/exec"
	"sync"
)

// TailBuffer keeps the last Max bytes written to it: enough of a child's
// output to explain a failure without unbounded growth. Its zero Max keeps
// nothing; set Max before use.
type TailBuffer struct {
	Max int

	mu  sync.Mutex // guards buf
	buf []byte
}

// Write appends p, dropping the oldest bytes beyond Max.
func (b *TailBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.buf = append(b.buf, p...)
	if over := len(b.buf) - b.Max; over > 0 {
		b.buf = append(b.buf[:0], b.buf[over:]...)
	}
	return len(p), nil
}

// String returns the bytes kept.
func (b *TailBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return string(b.buf)
}

// Watch reads the child's output pipe to its end in the background, so that
// the child never blocks on a full pipe: each line goes to log (when not
// nil), and the address in the first line ready recognises is sent on the
// returned channel. Once the pipe is read (os/exec wants Wait after the last
// read) it waits for cmd, stores Wait's error in *waitErr and closes done.
func Watch(cmd *exec.Cmd, pipe io.Reader, log io.Writer, ready func(line []byte) (string, bool), done chan struct{}, waitErr *error) <-chan string {
	if log == nil {
		log = io.Discard
	}
	addr := make(chan string, 1)
	readDone := make(chan struct{})
	go func() {
		defer close(readDone)
		sc := bufio.NewScanner(pipe)
		sc.Buffer(make([]byte, 64<<10), 1<<20)
		for sc.Scan() {
			line := sc.Bytes()
			_, _ = log.Write(append(line, '\n'))
			if a, ok := ready(line); ok {
				select {
				case addr <- a:
				default:
				}
			}
		}
		_, _ = io.Copy(log, pipe) // what a line too long left behind
	}()
	go func() {
		<-readDone
		*waitErr = cmd.Wait()
		close(done)
	}()
	return addr
}
