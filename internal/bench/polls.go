package bench

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/taskledger/taskledger/api"
)

// The waiting polls' clients run in a child process of the bench: the
// same binary, started with pollsEnv set. Each process then holds one
// socket a poll, so a machine whose processes may each open 20,000 files
// holds 10,000 polls, and the bench process's memory per poll is the
// server's alone.
//
// The child writes a line "claimed ID" for each task it claims (it
// records the task's result right after), holds its polls until its
// standard input closes, and then writes "errors N": the requests that
// failed while the polls were wanted.
const pollsEnv = "TASKLEDGER_BENCH_POLLS"

// PollsChild holds the polls and exits in a process the bench started
// for its polls; elsewhere it returns at once. Call it first thing in main
// (and in TestMain) of any binary that runs the bench.
func PollsChild() {
	spec, ok := os.LookupEnv(pollsEnv)
	if !ok {
		return
	}
	if err := holdPolls(spec, os.Stdin, os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "bench polls:", err)
		os.Exit(1)
	}
	os.Exit(0)
}

// holdPolls holds the polls spec names ("URL QUEUE N") until stop
// reaches its end, writing the lines above to out.
func holdPolls(spec string, stop io.Reader, out io.Writer) error {
	var url, queue string
	var n int
	if _, err := fmt.Sscan(spec, &url, &queue, &n); err != nil || n <= 0 {
		return fmt.Errorf("%s=%q: want URL QUEUE N", pollsEnv, spec)
	}
	if fit := fdBudget(); n > fit {
		return fmt.Errorf("%d polls, but only %d files may be opened", n, fit)
	}
	ctx, cancel := context.WithCancel(context.Background())
	go func() {
		io.Copy(io.Discard, stop)
		cancel()
	}()
	c := httpClient(url, n)
	defer c.HTTP.CloseIdleConnections()
	var mu sync.Mutex
	var errs atomic.Int64
	var wg sync.WaitGroup
	for w := range n {
		wg.Go(func() {
			for ctx.Err() == nil {
				t, ok, err := c.ClaimNext(ctx, queue, fmt.Sprintf("crowd-%d", w), scheduledWait)
				switch {
				case err != nil && ctx.Err() == nil:
					errs.Add(1)
				case ok:
					mu.Lock()
					fmt.Fprintln(out, "claimed", t.ID)
					mu.Unlock()
					if _, err := c.RecordResult(context.WithoutCancel(ctx), t.ID, api.ResultRequest{DeliveryID: t.Claim.DeliveryID, Success: true}); err != nil {
						errs.Add(1)
					}
				}
			}
		})
	}
	wg.Wait()
	_, err := fmt.Fprintln(out, "errors", errs.Load())
	return err
}

// pollsChild is a running child process holding polls.
type pollsChild struct {
	cmd     *exec.Cmd
	stdin   io.Closer
	claimed chan string   // a task id for each claim
	exited  chan struct{} // closed when the child's output has ended
	errs    int64         // the child's count of failed requests,
	counted bool          // once it reported it (both set before exited closes)

	once sync.Once
	err  error
}

// startPolls starts a child process holding n polls on queue at url.
func startPolls(url, queue string, n int, stderr io.Writer) (*pollsChild, error) {
	self, err := os.Executable()
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(self)
	cmd.Env = append(os.Environ(), fmt.Sprintf("%s=%s %s %d", pollsEnv, url, queue, n))
	cmd.Stderr = stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	p := &pollsChild{cmd: cmd, stdin: stdin, claimed: make(chan string, n), exited: make(chan struct{})}
	go func() {
		defer close(p.exited)
		lines := bufio.NewScanner(stdout)
		for lines.Scan() {
			word, rest, _ := strings.Cut(lines.Text(), " ")
			switch word {
			case "claimed":
				p.claimed <- rest
			case "errors":
				_, err := fmt.Sscan(rest, &p.errs)
				p.counted = err == nil
			}
		}
		io.Copy(io.Discard, stdout) // after a scan error too: the child must not block writing
	}()
	return p, nil
}

// stop ends the child's polls and returns its count of failed requests;
// called again, it returns the same.
func (p *pollsChild) stop() (int64, error) {
	p.once.Do(func() {
		p.stdin.Close()
		<-p.exited
		p.err = p.cmd.Wait()
		if p.err == nil && !p.counted {
			p.err = fmt.Errorf("it did not report its errors")
		}
		if p.err != nil {
			p.err = fmt.Errorf("the polls' process: %w", p.err)
		}
	})
	return p.errs, p.err
}

// early stops a child whose output ended before it was told to stop.
func (p *pollsChild) early() error {
	_, err := p.stop()
	return fmt.Errorf("the polls' process ended early: %v", err)
}
