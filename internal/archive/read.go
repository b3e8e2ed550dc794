package archive

import (
	"bufio"
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"hash"
	"io"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/taskledger/taskledger/aggregate"
	"github.com/taskledger/taskledger/events"
	"github.com/taskledger/taskledger/internal/eventlog"
)

// maxManifest bounds the manifest Open reads: a log has at most
// eventlog.MaxShards parts, each described in well under 1 KiB.
const maxManifest = 1 << 20

// Archive reads an archive directory as eventlog.Log reads the live log.
// Every read streams the part files from their start and checks each
// record as it goes (framing, sequences); a read that reaches a part's
// end also checks its count, chain and file hash, and fails with
// ErrDamaged where the files differ from the manifest. It is safe for
// concurrent use.
type Archive struct {
	Dir      string
	Manifest Manifest
	shards   events.Shards
	subjects events.Subjects
}

var _ eventlog.TaskReader = (*Archive)(nil)

// Open reads and checks dir's manifest, and that every part file it names
// is there with its size: cheap, it reads no record (Verify reads all).
func Open(dir string) (*Archive, error) {
	a, err := openManifest(dir)
	if err != nil {
		return nil, err
	}
	for _, p := range a.Manifest.Parts {
		fi, err := os.Stat(filepath.Join(dir, p.File))
		if err != nil {
			return nil, fmt.Errorf("%w: part %d: %w", ErrDamaged, p.Part, err)
		}
		if fi.Size() != p.Bytes {
			return nil, fmt.Errorf("%w: part %d: %s has %d bytes, the manifest says %d", ErrDamaged, p.Part, p.File, fi.Size(), p.Bytes)
		}
	}
	return a, nil
}

// openManifest is Open without looking at the part files.
func openManifest(dir string) (*Archive, error) {
	f, err := os.Open(filepath.Join(dir, ManifestFile))
	if err != nil {
		return nil, fmt.Errorf("archive: %w", err)
	}
	defer f.Close()
	var m Manifest
	if err := json.NewDecoder(io.LimitReader(f, maxManifest)).Decode(&m); err != nil {
		return nil, fmt.Errorf("%w: %s: %w", ErrDamaged, ManifestFile, err)
	}
	if err := m.check(); err != nil {
		return nil, err
	}
	return &Archive{Dir: dir, Manifest: m, shards: m.Layout(), subjects: events.Subjects{Root: m.Subjects}}, nil
}

// check returns why m is not a manifest this package wrote, or nil.
func (m Manifest) check() error {
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%w: %s: %s", ErrDamaged, ManifestFile, fmt.Sprintf(format, args...))
	}
	switch {
	case m.Format != Format:
		return bad("format %d, this build reads %d", m.Format, Format)
	case m.Shards < 1 || m.Shards > eventlog.MaxShards || m.EpochSlots < 0 || m.EpochSlots > eventlog.MaxEpochSlots:
		return bad("%d shards, %d epoch slots", m.Shards, m.EpochSlots)
	case m.Stream == "" || m.Subjects == "" || m.Epoch == "" || len(m.Parts) == 0:
		return bad("no stream, subjects, epoch or parts")
	}
	shards := m.Layout()
	for i, p := range m.Parts {
		switch {
		case p.Part < 0 || p.Part >= shards.N() || i > 0 && p.Part <= m.Parts[i-1].Part:
			return bad("part %d out of order or range", p.Part)
		case p.File != fileName(p.Part) || p.Stream != shards.Stream(m.Stream, p.Part):
			return bad("part %d names file %q and stream %q", p.Part, p.File, p.Stream)
		case p.Count == 0 && (p.FirstSeq != 0 || p.LastSeq != 0 || p.Head != nil):
			return bad("part %d is empty but names sequences or a head", p.Part)
		case p.Count > 0 && (p.FirstSeq == 0 || p.LastSeq < p.FirstSeq || p.LastSeq-p.FirstSeq+1 != p.Count):
			return bad("part %d: %d events do not fill sequences %d to %d", p.Part, p.Count, p.FirstSeq, p.LastSeq)
		case p.Count > 0 && (p.Head == nil || p.Head.Pos != shards.Position(p.Part, p.LastSeq)):
			return bad("part %d: no chain head at its last event", p.Part)
		}
	}
	return nil
}

// record is one archived message.
type record struct {
	seq     uint64 // stream sequence
	time    time.Time
	subject string
	data    []byte
}

// partReader streams one part file, checking each record against the
// manifest's part as it comes.
type partReader struct {
	p     Part
	f     *os.File
	br    *bufio.Reader
	sum   hash.Hash // of the file's bytes read so far
	chain Sum
	n     uint64 // records read
	last  uint64 // the last record's sequence
	bytes int64  // read of the file
	hdr   [4 + recordHeader]byte
}

func openPart(dir string, p Part) (*partReader, error) {
	f, err := os.Open(filepath.Join(dir, p.File))
	if err != nil {
		return nil, fmt.Errorf("%w: part %d: %w", ErrDamaged, p.Part, err)
	}
	r := &partReader{p: p, f: f, sum: sha256.New(), bytes: int64(len(magic))}
	r.br = bufio.NewReaderSize(io.TeeReader(f, r.sum), 1<<20)
	var m [len(magic)]byte
	if _, err := io.ReadFull(r.br, m[:]); err != nil || string(m[:]) != magic {
		f.Close()
		return nil, fmt.Errorf("%w: part %d: %s is not an archive part file", ErrDamaged, p.Part, p.File)
	}
	return r, nil
}

func (r *partReader) close() { r.f.Close() }

// fail returns ErrDamaged naming the part and where in it.
func (r *partReader) fail(format string, args ...any) error {
	where := "at its start"
	if r.n > 0 {
		where = fmt.Sprintf("after sequence %d", r.last)
	}
	return fmt.Errorf("%w: part %d (%s) %s: %s", ErrDamaged, r.p.Part, r.p.File, where, fmt.Sprintf(format, args...))
}

// next returns the next record; ok is false at the file's end, once the
// count, the chain and the file's hash are checked. Each call consumes
// at least a record's length, so a loop of them ends with the file.
func (r *partReader) next() (rec record, ok bool, err error) {
	if _, err := io.ReadFull(r.br, r.hdr[:4]); errors.Is(err, io.EOF) {
		return record{}, false, r.end()
	} else if err != nil {
		return record{}, false, r.fail("a record's length is cut short (%v)", err)
	}
	n := binary.LittleEndian.Uint32(r.hdr[:4])
	if n < recordHeader || n > maxRecord {
		return record{}, false, r.fail("a record of %d bytes, outside %d to %d", n, recordHeader, maxRecord)
	}
	if _, err := io.ReadFull(r.br, r.hdr[4:]); err != nil {
		return record{}, false, r.fail("a record's header is cut short (%v)", err)
	}
	seq := binary.LittleEndian.Uint64(r.hdr[4:])
	rec = record{seq: seq, time: time.Unix(0, int64(binary.LittleEndian.Uint64(r.hdr[12:]))).UTC()}
	subjectLen := uint32(binary.LittleEndian.Uint16(r.hdr[20:]))
	switch want := r.p.FirstSeq; {
	case r.n == 0 && seq != want:
		return record{}, false, r.fail("sequence %d, the manifest's first is %d", seq, want)
	case r.n > 0 && seq != r.last+1:
		return record{}, false, r.fail("sequence %d instead of %d", seq, r.last+1)
	case seq > r.p.LastSeq:
		return record{}, false, r.fail("sequence %d past the manifest's last, %d", seq, r.p.LastSeq)
	case subjectLen > n-recordHeader:
		return record{}, false, r.fail("sequence %d: a subject of %d bytes in a record of %d", seq, subjectLen, n)
	}
	body := make([]byte, n-recordHeader)
	if _, err := io.ReadFull(r.br, body); err != nil {
		return record{}, false, r.fail("sequence %d is cut short (%v)", seq, err)
	}
	rec.subject, rec.data = string(body[:subjectLen]), body[subjectLen:]
	r.chain = chainNext(r.chain, r.hdr[:], body)
	r.n, r.last, r.bytes = r.n+1, seq, r.bytes+4+int64(n)
	return rec, true, nil
}

// end checks the part once its file is read to the end.
func (r *partReader) end() error {
	switch {
	case r.n != r.p.Count:
		return r.fail("the file ends after %d events, the manifest says %d (last sequence %d)", r.n, r.p.Count, r.p.LastSeq)
	case r.bytes != r.p.Bytes:
		return r.fail("the file has %d bytes, the manifest says %d", r.bytes, r.p.Bytes)
	case r.chain != r.p.Chain:
		return r.fail("the records' chain ends at %s, the manifest says %s: a record was changed", r.chain, r.p.Chain)
	case Sum(r.sum.Sum(nil)) != r.p.SHA256:
		return r.fail("the file's SHA-256 is not the manifest's")
	}
	return nil
}

// scan calls fn with every record of the parts keep selects (nil: all),
// in order, part after part. It stops at fn's first error, or when ctx
// ends (returning ctx.Err()).
func (a *Archive) scan(ctx context.Context, keep func(Part) bool, fn func(Part, record) error) error {
	for _, p := range a.Manifest.Parts {
		if keep != nil && !keep(p) {
			continue
		}
		if err := a.scanPart(ctx, p, fn); err != nil {
			return err
		}
	}
	return nil
}

func (a *Archive) scanPart(ctx context.Context, p Part, fn func(Part, record) error) error {
	r, err := openPart(a.Dir, p)
	if err != nil {
		return err
	}
	defer r.close()
	for {
		if err := ctx.Err(); err != nil {
			return err
		}
		rec, ok, err := r.next()
		if err != nil || !ok {
			return err
		}
		if err := fn(p, rec); err != nil {
			return err
		}
	}
}

// Read calls fn for every archived message, part after part, each in
// stream order, as eventlog.Log.Read does: a message's Seq is its position.
func (a *Archive) Read(ctx context.Context, fn func(eventlog.Message) error) error {
	return a.scan(ctx, nil, func(p Part, rec record) error {
		return fn(eventlog.Message{Pos: a.shards.Position(p.Part, rec.seq), Subject: rec.subject, Data: rec.data, Time: rec.time})
	})
}

// Events calls fn for every archived event, in order; one that does not
// decode ends the read with its position in the error.
func (a *Archive) Events(ctx context.Context, fn func(events.Event) error) error {
	return a.Read(ctx, func(m eventlog.Message) error {
		ev, err := events.DecodeAt(m.Data, m.Pos)
		if err != nil {
			return fmt.Errorf("archive: seq %d: %w", m.Pos, err)
		}
		return fn(ev)
	})
}

// events calls fn for every event of the parts keep selects whose subject
// match accepts, given the part's subjects.
func (a *Archive) events(ctx context.Context, keep func(Part) bool, match func(subj events.Subjects, subject string) bool, fn func(events.Event) error) error {
	return a.scan(ctx, keep, func(p Part, rec record) error {
		if !match(a.shards.Subjects(a.subjects, p.Part), rec.subject) {
			return nil
		}
		pos := a.shards.Position(p.Part, rec.seq)
		ev, err := events.DecodeAt(rec.data, pos)
		if err != nil {
			return fmt.Errorf("archive: seq %d: %w", pos, err)
		}
		return fn(ev)
	})
}

// Task returns one task's archived events in log order (none for an
// unknown id), as eventlog.Log.Task.
func (a *Archive) Task(ctx context.Context, taskID string) ([]events.Event, error) {
	var evs []events.Event
	err := a.events(ctx, nil, func(subj events.Subjects, subject string) bool {
		rest, ok := strings.CutPrefix(subject, subj.Root+".evt.")
		_, task, _ := strings.Cut(rest, ".")
		return ok && task == taskID
	}, func(ev events.Event) error {
		evs = append(evs, ev)
		return nil
	})
	return evs, err
}

// LineageOf returns the archived events of the whole lineage taskID
// belongs to, in log order; nil for an unknown id (eventlog.Log.LineageOf).
func (a *Archive) LineageOf(ctx context.Context, taskID string) ([]events.Event, error) {
	return eventlog.FindLineage(ctx, a, taskID)
}

// Lineage returns the archived events of the lineage root heads, in log
// order: its customer's events in the root's part from the root's first
// (eventlog.Log.Lineage).
func (a *Archive) Lineage(ctx context.Context, root aggregate.State) ([]events.Event, error) {
	if root.Spec.RootID == "" {
		return nil, nil
	}
	part, _ := a.shards.Split(root.FirstSeq)
	in := eventlog.InLineage(root.Spec.RootID)
	var out []events.Event
	err := a.events(ctx, func(p Part) bool { return p.Part == part }, func(subj events.Subjects, subject string) bool {
		return strings.HasPrefix(subject, strings.TrimSuffix(subj.Customer(root.CustomerID), ">"))
	}, func(ev events.Event) error {
		if ev.Seq >= root.FirstSeq && in(ev) {
			out = append(out, ev)
		}
		return nil
	})
	return out, err
}
