package broker

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// ErrStopped is Sync's answer once the server has shut down: what was
// written and not yet synced by then is synced by the shutdown itself,
// or not at all if the process dies first.
var ErrStopped = errors.New("broker: embedded server stopped")

// groupCommit makes the embedded server's acknowledged writes durable in
// shared fsyncs, as PostgreSQL's group commit does: every Sync call
// joins the next round, and a round fsyncs the files JetStream has
// written to once for all of its callers. A round starts as soon as the
// one before it ends, so under load a round covers every write
// acknowledged while the previous one ran, and an idle server syncs a
// lone write at once.
//
// It relies on how nats-server's file store writes (filestore.go, with
// its default flush in place): a message is written to its block file
// (a write(2), into the page cache) before the append is acknowledged,
// and never fsynced unless the server syncs every write. An fsync after
// the acknowledgement therefore makes it durable.
type groupCommit struct {
	files *fileSyncer // touched by run alone
	kick  chan struct{}
	stop  chan struct{}
	ended chan struct{}

	mu   sync.Mutex
	next *round // the round not yet started: a new caller joins it
	err  error  // a failed fsync: sticky, see Sync

	rounds, callers atomic.Uint64
	nanos           atomic.Int64
}

// round is one fsync pass; done closes when it has ended, with err set.
type round struct {
	done chan struct{}
	err  error
}

func newGroupCommit(dir string) *groupCommit {
	g := &groupCommit{
		files: &fileSyncer{root: filepath.Join(dir, "jetstream"), known: make(map[string]bool)},
		kick:  make(chan struct{}, 1), stop: make(chan struct{}), ended: make(chan struct{}),
		next: &round{done: make(chan struct{})},
	}
	go g.run()
	return g
}

// Sync returns once every write the server acknowledged before the call
// is on stable storage: nil, ctx's error, ErrStopped, or the error of a
// failed fsync. A failed fsync is sticky: after one, the kernel may have
// dropped the dirty pages it could not write and a later fsync could
// succeed without them, so every later Sync fails too until the process
// restarts and reads back what is really on disk (PostgreSQL's rule).
// It is safe for concurrent use.
func (g *groupCommit) Sync(ctx context.Context) error {
	g.mu.Lock()
	r, err := g.next, g.err
	g.mu.Unlock()
	if err != nil {
		return err
	}
	g.callers.Add(1)
	select {
	case g.kick <- struct{}{}:
	default: // a round is already asked for; this caller's joins it
	}
	select {
	case <-r.done:
		return r.err
	case <-ctx.Done():
		return ctx.Err()
	case <-g.ended:
		return ErrStopped
	}
}

// run starts a round whenever a caller asks for one, until close.
func (g *groupCommit) run() {
	defer close(g.ended)
	for {
		select {
		case <-g.kick:
		case <-g.stop:
			return
		}
		g.mu.Lock()
		r := g.next
		g.next = &round{done: make(chan struct{})}
		g.mu.Unlock()
		start := time.Now()
		r.err = g.files.sync()
		g.nanos.Add(int64(time.Since(start)))
		g.rounds.Add(1)
		if r.err != nil {
			r.err = fmt.Errorf("broker: fsync: %w", r.err)
			g.mu.Lock()
			g.err = r.err
			g.mu.Unlock()
		}
		close(r.done)
	}
}

// close ends run; a caller waiting for a round that will not run gets
// ErrStopped. It is called once, by Shutdown.
func (g *groupCommit) close() {
	close(g.stop)
	<-g.ended
	for _, b := range g.files.streams {
		b.close()
	}
}

// CommitStats counts the group commit's work since start.
type CommitStats struct {
	Rounds  uint64        // fsync passes
	Callers uint64        // Sync calls: Callers / Rounds is the writes a pass covered on average
	Time    time.Duration // spent in the passes
	Err     error         // the sticky fsync failure, if any
}

func (g *groupCommit) stats() CommitStats {
	g.mu.Lock()
	err := g.err
	g.mu.Unlock()
	return CommitStats{Rounds: g.rounds.Load(), Callers: g.callers.Load(), Time: time.Duration(g.nanos.Load()), Err: err}
}

// fileSyncer knows which of JetStream's files hold unsynced writes. The
// file store writes a stream's messages to the highest-numbered block
// of its msgs directory (<n>.blk), appending, and starts a new block when
// that one is full; its other files (stream and consumer metadata, the
// index it rebuilds from the blocks when it is stale) it replaces whole
// by rename. So a pass fsyncs each stream's active block if it grew
// since the last pass (and, when a new block has appeared, the one
// before it a last time and the directory that now holds the new one),
// every block the store rewrote by rename since (activeBlock.replaced),
// and a new stream's files and directories once.
//
// A pass first finds that work, with a directory read per account and
// two stat calls per stream, then runs the fsyncs at once, up to
// syncWorkers at a time: every fsync costs a flush of the device's
// cache, even of a file with nothing to write (about 1 ms measured on
// this project's CI machines), and the file system serves concurrent
// fsyncs with one journal commit and one flush.
type fileSyncer struct {
	root    string                  // <data>/jetstream
	streams map[string]*activeBlock // stream directory → its active block
	known   map[string]bool         // account directories seen
}

// syncWorkers bounds the fsyncs of a pass that run at once.
const syncWorkers = 32

// syncJob is one fsync of a pass: of f, kept open, or else of the file
// or directory at path; then, if it succeeded, after.
type syncJob struct {
	f     *os.File
	path  string
	after func()
}

// activeBlock is the block a stream appends to, kept open, and what is
// known of the stream's other blocks.
type activeBlock struct {
	msgs   string    // the stream's msgs directory
	n      uint64    // its index; 0 until the stream has a block
	f      *os.File  // nil until opened
	synced int64     // its size at the last fsync
	listed time.Time // when msgs was last read
	mtime  time.Time // msgs's modification time then
	// files are the stream's block files as last seen, by index: a
	// block found to be another file now was rewritten (see replaced).
	files map[uint64]os.FileInfo
	// recheck, if set, is when to look for rewritten blocks once more:
	// the last look came within listMargin of the directory's change, so
	// a rename in the same tick of the coarse clock may have left its
	// time as it was.
	recheck time.Time
}

func (s *fileSyncer) sync() error {
	jobs, err := s.scan()
	if err != nil {
		return err
	}
	return runJobs(jobs)
}

// scan finds the fsyncs a pass needs.
func (s *fileSyncer) scan() ([]syncJob, error) {
	accounts, err := os.ReadDir(s.root)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil // no stream yet
	}
	if err != nil {
		return nil, err
	}
	var jobs []syncJob
	seen := make(map[string]bool, len(s.streams))
	for _, acc := range accounts {
		dir := filepath.Join(s.root, acc.Name(), "streams")
		names, err := os.ReadDir(dir)
		if errors.Is(err, fs.ErrNotExist) {
			continue
		}
		if err != nil {
			return nil, err
		}
		if !s.known[dir] {
			jobs = append(jobs, syncJob{path: s.root}, syncJob{path: filepath.Dir(dir)}, syncJob{path: dir})
			s.known[dir] = true
		}
		for _, name := range names {
			stream := filepath.Join(dir, name.Name())
			seen[stream] = true
			b := s.streams[stream]
			if b == nil {
				if b, jobs, err = s.open(stream, jobs); err != nil {
					return nil, err
				}
			}
			if jobs, err = b.scan(jobs); err != nil {
				return nil, err
			}
		}
	}
	for stream, b := range s.streams {
		if !seen[stream] { // removed (a sealed epoch's stream, a deleted bucket)
			b.close()
			delete(s.streams, stream)
		}
	}
	return jobs, nil
}

// open starts to follow a stream found for the first time: its files and
// directories are fsynced once, and so is the directory holding it.
func (s *fileSyncer) open(stream string, jobs []syncJob) (*activeBlock, []syncJob, error) {
	b := &activeBlock{msgs: filepath.Join(stream, "msgs")}
	entries, err := os.ReadDir(stream)
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return nil, nil, err
	}
	for _, e := range entries {
		if !e.IsDir() && !strings.HasSuffix(e.Name(), ".tmp") {
			jobs = append(jobs, syncJob{path: filepath.Join(stream, e.Name())})
		}
	}
	jobs = append(jobs, syncJob{path: b.msgs}, syncJob{path: stream}, syncJob{path: filepath.Dir(stream)})
	if s.streams == nil {
		s.streams = make(map[string]*activeBlock)
	}
	s.streams[stream] = b
	return b, jobs, nil
}

// listMargin is how long after a directory's modification time its
// listing is read again even if the time has not changed: the kernel
// stamps it with a coarse clock, so an entry added within one of its
// ticks after a listing leaves the time as it was.
const listMargin = 2 * time.Second

// scan adds the fsync of the active block if it grew. When the msgs
// directory has changed since it was last looked at (a block started, or
// an emptied one removed), it finds the active block again first: the
// highest block is the active one, and the ones it replaces are fsynced
// a last time, with the directory that now holds the new one. It lists
// the directory only when it has changed (or within listMargin of a
// change), so a pass of a stream at rest costs two stat calls however
// many blocks it has (docs/performance.md, "Growth").
func (b *activeBlock) scan(jobs []syncJob) ([]syncJob, error) {
	fi, err := os.Stat(b.msgs)
	if errors.Is(err, fs.ErrNotExist) {
		return jobs, nil // not created yet, or removed with its stream
	}
	if err != nil {
		return nil, err
	}
	now := time.Now()
	if changed := !fi.ModTime().Equal(b.mtime); changed || (!b.recheck.IsZero() && now.After(b.recheck)) {
		b.recheck = time.Time{}
		if now.Sub(fi.ModTime()) < listMargin {
			b.recheck = fi.ModTime().Add(listMargin)
		}
		if jobs, err = b.replaced(jobs); err != nil {
			return nil, err
		}
	}
	if !fi.ModTime().Equal(b.mtime) || b.listed.Sub(b.mtime) < listMargin {
		b.listed = time.Now()
		b.mtime = fi.ModTime()
		n, err := b.highest()
		if err != nil {
			return nil, err
		}
		if n != b.n {
			if old := b.f; old != nil { // the writes before the roll-over
				jobs = append(jobs, syncJob{f: old, after: func() { old.Close() }})
				b.f = nil
			}
			for k := b.n + 1; b.n > 0 && k < n; k++ { // blocks started and filled since the last pass
				jobs = append(jobs, syncJob{path: b.block(k)})
			}
			b.n = n
			jobs = append(jobs, syncJob{path: b.msgs}) // the new block's entry
		}
	}
	if b.n == 0 {
		return jobs, nil
	}
	if b.f == nil {
		f, err := os.Open(b.block(b.n))
		if errors.Is(err, fs.ErrNotExist) {
			return jobs, nil // removed meanwhile
		}
		if err != nil {
			return nil, err
		}
		b.f, b.synced = f, -1
	}
	fi, err = b.f.Stat()
	if err != nil {
		return nil, err
	}
	if size := fi.Size(); size != b.synced {
		jobs = append(jobs, syncJob{f: b.f, after: func() { b.synced = size }})
	}
	return jobs, nil
}

// replaced adds the fsyncs of the blocks nats-server rewrote since the
// last look: it compacts a block that is mostly deleted messages (a
// key-value bucket's old revisions), and may rewrite the active one, by
// writing a new file and renaming it over the old — without an fsync
// unless it syncs every write. The old file's data was durable, the new
// file's is not: a power cut could empty the block. So a block that is
// another file than last time is fsynced, with the directory that holds
// its new entry; if it is the active one, the handle kept open (of the
// old file) is dropped for the new. It lists the directory, so it
// runs only when the directory has changed (and once more after a change
// within the clock's tick, recheck).
func (b *activeBlock) replaced(jobs []syncJob) ([]syncJob, error) {
	entries, err := os.ReadDir(b.msgs)
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return nil, err
	}
	first := b.files == nil
	files := make(map[uint64]os.FileInfo, len(entries))
	rewritten := false
	for _, e := range entries {
		n := blockIndex(e.Name())
		if n == 0 {
			continue
		}
		fi, err := e.Info()
		if errors.Is(err, fs.ErrNotExist) {
			continue // removed meanwhile
		}
		if err != nil {
			return nil, err
		}
		files[n] = fi
		if prev, ok := b.files[n]; !ok || first || os.SameFile(prev, fi) {
			continue
		}
		rewritten = true
		if n == b.n && b.f != nil {
			b.close() // of the old file: scan reopens the block and fsyncs it whole
			continue
		}
		jobs = append(jobs, syncJob{path: b.block(n)})
	}
	if rewritten {
		jobs = append(jobs, syncJob{path: b.msgs})
	}
	b.files = files
	return jobs, nil
}

// highest returns the index of the stream's highest block (0 for none),
// from a listing of msgs. Not by probing for the blocks after the active
// one: the file store removes any block that has emptied, not only the
// first, so the numbers can have holes (a key-value bucket whose newer
// block was all overwritten), and a probe stopped by one would keep an
// old block as the active one and leave the new one unsynced.
func (b *activeBlock) highest() (uint64, error) {
	blocks, err := os.ReadDir(b.msgs)
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return 0, err
	}
	var n uint64
	for _, e := range blocks {
		n = max(n, blockIndex(e.Name()))
	}
	return n, nil
}

// block returns the path of the stream's block n.
func (b *activeBlock) block(n uint64) string {
	return filepath.Join(b.msgs, strconv.FormatUint(n, 10)+".blk")
}

func (b *activeBlock) close() {
	if b.f != nil {
		b.f.Close()
		b.f = nil
	}
}

// runJobs runs jobs, up to syncWorkers at a time, and returns the first
// error.
func runJobs(jobs []syncJob) error {
	next := make(chan syncJob)
	errs := make(chan error, 1)
	var wg sync.WaitGroup
	for range min(len(jobs), syncWorkers) {
		wg.Go(func() {
			for j := range next {
				if err := j.run(); err != nil {
					select {
					case errs <- err:
					default:
					}
				}
			}
		})
	}
	for _, j := range jobs {
		next <- j
	}
	close(next)
	wg.Wait()
	select {
	case err := <-errs:
		return err
	default:
		return nil
	}
}

func (j syncJob) run() error {
	f := j.f
	if f == nil {
		var err error
		if f, err = os.Open(j.path); errors.Is(err, fs.ErrNotExist) {
			return nil // removed meanwhile: nothing left to sync
		} else if err != nil {
			return err
		}
		defer f.Close()
	}
	if err := f.Sync(); err != nil {
		return err
	}
	if j.after != nil {
		j.after()
	}
	return nil
}

// blockIndex is n of a block file's name <n>.blk, or 0.
func blockIndex(name string) uint64 {
	s, ok := strings.CutSuffix(name, ".blk")
	if !ok {
		return 0
	}
	n, _ := strconv.ParseUint(s, 10, 64)
	return n
}
