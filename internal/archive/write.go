package archive

import (
	"bufio"
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"slices"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/taskledger/taskledger/events"
	"github.com/taskledger/taskledger/internal/eventlog"
)

// progressEvery is how many events Write archives between progress calls.
const progressEvery = 50000

// Write archives epoch of log into dir and returns its manifest. Every
// stream of the epoch's parts must be sealed (ErrNotSealed), so what is
// archived is what the cluster keeps until the streams are removed. It
// writes into a temporary sibling of dir and renames it into place at the
// end, so a crash or an error leaves no half archive at dir; dir must not
// exist or be empty (ErrNotEmpty). It streams each part to its file and
// holds one message at a time. progress, if set, is called about every
// 50,000 events and at the end with the events archived and the epoch's
// total. ctx ends the reads.
func Write(ctx context.Context, log eventlog.Log, epoch Epoch, dir string, progress func(done, total uint64)) (Manifest, error) {
	log = log.WithDefaults()
	parts, err := checkEpoch(epoch, log.Shards)
	if err != nil {
		return Manifest{}, err
	}
	if err := emptyOrAbsent(dir); err != nil {
		return Manifest{}, err
	}
	infos := make([]*jetstream.StreamInfo, len(parts))
	var total uint64
	for n, p := range parts {
		name := log.Shards.Stream(log.Stream, p)
		s, err := log.JS.Stream(ctx, name)
		if err != nil {
			return Manifest{}, fmt.Errorf("archive: part %d: stream %s: %w", p, name, err)
		}
		if infos[n] = s.CachedInfo(); !infos[n].Config.Sealed {
			return Manifest{}, fmt.Errorf("%w: part %d: stream %s", ErrNotSealed, p, name)
		}
		total += infos[n].State.Msgs
	}

	dir = filepath.Clean(dir)
	tmp, err := os.MkdirTemp(filepath.Dir(dir), "."+filepath.Base(dir)+".tmp-")
	if err != nil {
		return Manifest{}, fmt.Errorf("archive: %w", err)
	}
	renamed := false
	defer func() {
		if !renamed {
			os.RemoveAll(tmp)
		}
	}()
	m := Manifest{
		Format: Format, Stream: log.Stream, Subjects: log.Subjects.Root, Shards: max(log.Shards.K, 1), EpochSlots: log.Shards.Slots,
		Epoch: epoch.Name, From: epoch.From.UTC(), To: epoch.To.UTC(), Created: time.Now().UTC(),
	}
	w := partWriter{log: log, dir: tmp, total: total, progress: progress}
	for n, p := range parts {
		pm, err := w.write(ctx, p, infos[n])
		if err != nil {
			return Manifest{}, err
		}
		m.Parts = append(m.Parts, pm)
	}
	if progress != nil {
		progress(w.done, total)
	}
	data, err := json.MarshalIndent(m, "", "  ")
	if err != nil {
		return Manifest{}, err
	}
	if err := writeSynced(filepath.Join(tmp, ManifestFile), append(data, '\n')); err != nil {
		return Manifest{}, err
	}
	if err := syncDir(tmp); err != nil {
		return Manifest{}, err
	}
	if err := os.Remove(dir); err != nil && !errors.Is(err, os.ErrNotExist) { // an empty dir: checked above
		return Manifest{}, fmt.Errorf("archive: %w", err)
	}
	if err := os.Rename(tmp, dir); err != nil {
		return Manifest{}, fmt.Errorf("archive: %w", err)
	}
	renamed = true
	return m, syncDir(filepath.Dir(dir))
}

// checkEpoch returns the epoch's parts, ascending, or why they are not
// parts of a log sharded as shards.
func checkEpoch(e Epoch, shards events.Shards) ([]int, error) {
	if e.Name == "" || len(e.Parts) == 0 {
		return nil, fmt.Errorf("archive: epoch %q: a name and at least one part are needed", e.Name)
	}
	parts := slices.Sorted(slices.Values(e.Parts))
	for i, p := range parts {
		if p < 0 || p >= shards.N() || i > 0 && parts[i-1] == p {
			return nil, fmt.Errorf("archive: epoch %q: part %d is not one of the log's %d, or named twice", e.Name, p, shards.N())
		}
	}
	return parts, nil
}

// emptyOrAbsent returns ErrNotEmpty when dir exists and holds an entry.
func emptyOrAbsent(dir string) error {
	f, err := os.Open(dir)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("archive: %w", err)
	}
	defer f.Close()
	names, err := f.Readdirnames(1)
	if len(names) > 0 {
		return fmt.Errorf("%w: %s", ErrNotEmpty, dir)
	}
	if err != nil && !errors.Is(err, io.EOF) {
		return fmt.Errorf("archive: %s: %w", dir, err)
	}
	return nil
}

// partWriter writes the part files of one archive.
type partWriter struct {
	log         eventlog.Log
	dir         string
	done, total uint64
	progress    func(done, total uint64)
}

// write archives part p, whose stream's info is info, and returns its
// description.
func (w *partWriter) write(ctx context.Context, p int, info *jetstream.StreamInfo) (Part, error) {
	pm := Part{Part: p, Stream: info.Config.Name, File: fileName(p)}
	f, err := CreateFile(filepath.Join(w.dir, pm.File))
	if err != nil {
		return Part{}, err
	}
	defer f.Close()
	sum := sha256.New()
	counted := &countingWriter{w: io.MultiWriter(f, sum)}
	bw := bufio.NewWriterSize(counted, 1<<20)
	bw.WriteString(magic)
	var rec []byte
	var last events.Hash // of the last message's stored bytes
	err = w.log.Read(ctx, eventlog.ReadOptions{Shards: []int{p}}, func(msg eventlog.Message) error {
		_, seq := w.log.Shards.Split(msg.Pos)
		switch {
		case pm.Count > 0 && seq != pm.LastSeq+1:
			return fmt.Errorf("%w: part %d: sequences %d to %d hold no message", ErrIncomplete, p, pm.LastSeq+1, seq-1)
		case len(msg.Data) > MaxData || len(msg.Subject) > math.MaxUint16:
			return fmt.Errorf("%w: part %d: sequence %d: %d bytes on a subject of %d, above the archive's limits", ErrIncomplete, p, seq, len(msg.Data), len(msg.Subject))
		case pm.Count == 0:
			pm.FirstSeq = seq
		}
		rec = appendRecord(rec[:0], seq, msg)
		if _, err := bw.Write(rec); err != nil {
			return fmt.Errorf("archive: %w", err)
		}
		pm.Chain = chainNext(pm.Chain, rec)
		pm.LastSeq, pm.Count, last = seq, pm.Count+1, events.HashOf(msg.Data)
		if w.done++; w.progress != nil && w.done%progressEvery == 0 {
			w.progress(w.done, w.total)
		}
		return nil
	})
	if err != nil {
		return Part{}, err
	}
	if err := bw.Flush(); err != nil {
		return Part{}, fmt.Errorf("archive: %w", err)
	}
	if err := f.Sync(); err != nil {
		return Part{}, fmt.Errorf("archive: %w", err)
	}
	pm.Bytes, pm.SHA256 = counted.n, Sum(sum.Sum(nil))
	if !holds(info, pm) {
		st := info.State
		return Part{}, fmt.Errorf("%w: part %d: read %d messages, sequences %d to %d; the sealed stream holds %d, %d to %d", ErrIncomplete, p, pm.Count, pm.FirstSeq, pm.LastSeq, st.Msgs, st.FirstSeq, st.LastSeq)
	}
	if pm.Count > 0 {
		head, err := w.log.HeadAt(ctx, w.log.Shards.Position(p, pm.LastSeq))
		if err != nil {
			return Part{}, fmt.Errorf("archive: part %d: %w", p, err)
		}
		if head.Hash != last {
			return Part{}, fmt.Errorf("%w: part %d: the chain head at sequence %d is not the message read there", ErrIncomplete, p, pm.LastSeq)
		}
		pm.Head = &head
	}
	return pm, nil
}

// appendRecord appends the record of msg, stored at stream sequence seq,
// to b.
func appendRecord(b []byte, seq uint64, msg eventlog.Message) []byte {
	b = binary.LittleEndian.AppendUint32(b, uint32(recordHeader+len(msg.Subject)+len(msg.Data)))
	b = binary.LittleEndian.AppendUint64(b, seq)
	b = binary.LittleEndian.AppendUint64(b, uint64(msg.Time.UnixNano()))
	b = binary.LittleEndian.AppendUint16(b, uint16(len(msg.Subject)))
	b = append(b, msg.Subject...)
	return append(b, msg.Data...)
}

// countingWriter counts the bytes written through it.
type countingWriter struct {
	w io.Writer
	n int64
}

func (c *countingWriter) Write(b []byte) (int, error) {
	n, err := c.w.Write(b)
	c.n += int64(n)
	return n, err
}

// FileMode is the mode of every file of an archive: it holds every
// tenant's events, for the operator's user alone. The directory is 0700.
const FileMode = 0o600

// CreateFile creates (or truncates) the archive file path with FileMode,
// whatever the umask and whatever mode a file already there had.
func CreateFile(path string) (*os.File, error) {
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|os.O_TRUNC, FileMode)
	if err == nil {
		if err = f.Chmod(FileMode); err != nil {
			f.Close()
		}
	}
	if err != nil {
		return nil, fmt.Errorf("archive: %w", err)
	}
	return f, nil
}

func writeSynced(path string, data []byte) error {
	f, err := CreateFile(path)
	if err != nil {
		return err
	}
	defer f.Close()
	if _, err := f.Write(data); err != nil {
		return fmt.Errorf("archive: %w", err)
	}
	if err := f.Sync(); err != nil {
		return fmt.Errorf("archive: %w", err)
	}
	return f.Close()
}

// syncDir makes the entries of dir durable.
func syncDir(dir string) error {
	f, err := os.Open(dir)
	if err != nil {
		return fmt.Errorf("archive: %w", err)
	}
	defer f.Close()
	if err := f.Sync(); err != nil {
		return fmt.Errorf("archive: sync %s: %w", dir, err)
	}
	return nil
}
