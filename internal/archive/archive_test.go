package archive

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/taskledger/taskledger/api"
	"github.com/taskledger/taskledger/events"
	"github.com/taskledger/taskledger/internal/eventlog"
	"github.com/taskledger/taskledger/internal/node"
	"github.com/taskledger/taskledger/internal/testnats"
	"github.com/taskledger/taskledger/internal/testnode"
	"github.com/taskledger/taskledger/replay"
)

func TestMain(m *testing.M) { testnats.Main(m) }

// traffic is what writeLog wrote: every root, and which were canceled
// and which have a child.
type traffic struct {
	roots, children []string
	canceled        []string
}

// writeLog runs a node on k shards, schedules 200 roots and 40 children,
// cancels 20 roots and runs every other task to a result (success or a
// final failure), stops the node and returns a reader of its log.
func writeLog(t *testing.T, k int) (eventlog.Log, traffic) {
	t.Helper()
	n := testnode.Start(t, func(c *node.Config) { c.Shards = k })
	ctx := context.Background()
	c := n.Client
	msg := func(s string) events.Message {
		return events.Message{Content: []events.ContentPart{{Type: "text", Text: s}}}
	}
	schedule := func(reqs []api.ScheduleRequest) []string {
		items, err := c.ScheduleBatch(ctx, reqs)
		if err != nil {
			t.Fatal(err)
		}
		var ids []string
		for _, it := range items {
			if err := it.Err(); err != nil {
				t.Fatal(err)
			}
			ids = append(ids, it.Task.ID)
		}
		return ids
	}
	var tr traffic
	for b := range 2 {
		reqs := make([]api.ScheduleRequest, 100)
		for i := range reqs {
			reqs[i] = api.ScheduleRequest{Queue: "arch", Message: msg(fmt.Sprintf("root %d", b*100+i))}
		}
		tr.roots = append(tr.roots, schedule(reqs)...)
	}
	var reqs []api.ScheduleRequest
	for i := range 40 {
		reqs = append(reqs, api.ScheduleRequest{Queue: "arch", ParentID: tr.roots[i], Message: msg("child")})
	}
	tr.children = schedule(reqs)
	tr.canceled = tr.roots[150:170]
	for _, id := range tr.canceled {
		if _, err := c.Cancel(ctx, id, "not needed"); err != nil {
			t.Fatal(err)
		}
	}
	final := false
	deadline := time.Now().Add(60 * time.Second)
	// Until no task waits: a child whose root ended first is canceled
	// (ancestor_terminal) by the claim that finds it instead of run.
	waiting := func() int {
		n := 0
		for _, status := range []string{"scheduled", "queued"} {
			l, err := c.List(ctx, api.ListOptions{Queue: "arch", Status: status, Limit: 1})
			if err != nil {
				t.Fatal(err)
			}
			n += len(l.Tasks)
		}
		return n
	}
	for done := 0; waiting() > 0; {
		if time.Now().After(deadline) {
			t.Fatalf("%d tasks ran, %d still waiting after 60s", done, waiting())
		}
		tasks, err := c.ClaimBatch(ctx, "arch", "arch-exec", 64, 500*time.Millisecond)
		if err != nil {
			t.Fatal(err)
		}
		if len(tasks) == 0 {
			continue
		}
		var results []api.ResultItem
		for i, task := range tasks {
			r := api.ResultRequest{DeliveryID: task.Claim.DeliveryID, Success: i%3 != 0, Summary: "done"}
			if !r.Success {
				r.Error, r.Retryable = "boom", &final
			}
			results = append(results, api.ResultItem{TaskID: task.ID, ResultRequest: r})
		}
		items, err := c.RecordResults(ctx, results)
		if err != nil {
			t.Fatal(err)
		}
		for _, it := range items {
			if err := it.Err(); err != nil {
				t.Fatal(err)
			}
		}
		done += len(tasks)
	}
	n.Stop()
	js, err := jetstream.New(testnats.Conn(t))
	if err != nil {
		t.Fatal(err)
	}
	return eventlog.Log{JS: js, Stream: n.NS.Stream, Subjects: n.NS.Subjects, Shards: events.Shards{K: k}}, tr
}

// seal seals every stream of log.
func seal(t *testing.T, log eventlog.Log) {
	t.Helper()
	ctx := context.Background()
	for i := range log.Shards.N() {
		s, err := log.JS.Stream(ctx, log.Shards.Stream(log.Stream, i))
		if err != nil {
			t.Fatal(err)
		}
		cfg := s.CachedInfo().Config
		cfg.Sealed = true
		if _, err := log.JS.UpdateStream(ctx, cfg); err != nil {
			t.Fatal(err)
		}
	}
}

func allParts(log eventlog.Log) Epoch {
	e := Epoch{Name: "0"}
	for i := range log.Shards.N() {
		e.Parts = append(e.Parts, i)
	}
	return e
}

// liveEvents returns every event of log, in order.
func liveEvents(t *testing.T, log eventlog.Log, parts []int) []events.Event {
	t.Helper()
	var evs []events.Event
	err := log.Events(context.Background(), eventlog.ReadOptions{Shards: parts}, func(ev events.Event) error {
		evs = append(evs, ev)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return evs
}

// verifyReport is replay verify's report over read, expecting heads.
func verifyReport(t *testing.T, subjects events.Subjects, shards events.Shards, heads []eventlog.Head, read func(func(eventlog.Message) error) error) replay.Report {
	t.Helper()
	v := replay.NewVerifier(subjects)
	v.Shard(shards)
	for _, h := range heads {
		v.ExpectHead(h.Pos, h.Hash)
	}
	if err := read(func(m eventlog.Message) error {
		v.Add(m.Pos, m.Subject, m.Data)
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	return v.Report()
}

// sameReaders checks that the archive reads as the live log does: every
// event, the tasks and the lineages of ids, and replay verify's report.
func sameReaders(t *testing.T, log eventlog.Log, a *Archive, ids []string) {
	t.Helper()
	ctx := context.Background()
	got := archived(t, a)
	if want := liveEvents(t, log, nil); !reflect.DeepEqual(got, want) {
		t.Fatalf("the archive holds %d events, the live log %d, or other ones", len(got), len(want))
	}
	for _, id := range ids {
		for what, read := range map[string][2]func(context.Context, string) ([]events.Event, error){
			"Task": {a.Task, log.Task}, "LineageOf": {a.LineageOf, log.LineageOf},
		} {
			got, err := read[0](ctx, id)
			if err != nil {
				t.Fatal(err)
			}
			want, err := read[1](ctx, id)
			if err != nil {
				t.Fatal(err)
			}
			if len(want) == 0 || !reflect.DeepEqual(got, want) {
				t.Fatalf("%s(%s): the archive has %d events, the live log %d", what, id, len(got), len(want))
			}
			if !reflect.DeepEqual(replay.Timeline(got), replay.Timeline(want)) {
				t.Fatalf("%s(%s): the histories differ", what, id)
			}
		}
	}
	if evs, err := a.Task(ctx, "NOSUCHTASK"); err != nil || evs != nil {
		t.Fatalf("an unknown task: %v, %v", evs, err)
	}
	heads := a.Manifest.Heads()
	archived := verifyReport(t, log.Subjects, log.Shards, heads, func(fn func(eventlog.Message) error) error { return a.Read(ctx, fn) })
	live := verifyReport(t, log.Subjects, log.Shards, heads, func(fn func(eventlog.Message) error) error {
		return log.Read(ctx, eventlog.ReadOptions{}, fn)
	})
	if !archived.Clean() || !reflect.DeepEqual(archived, live) {
		t.Fatalf("replay verify on the archive: %+v; on the live log: %+v", archived, live)
	}
}

func TestArchive(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	log, tr := writeLog(t, 1)

	t.Run("UnsealedRefused", func(t *testing.T) {
		parent := t.TempDir()
		_, err := Write(ctx, log, allParts(log), filepath.Join(parent, "a"), nil)
		if !errors.Is(err, ErrNotSealed) {
			t.Fatalf("Write of an unsealed log: %v, want ErrNotSealed", err)
		}
		if entries, _ := os.ReadDir(parent); len(entries) != 0 {
			t.Fatalf("a refused Write left %v", entries)
		}
	})
	seal(t, log)

	dir := filepath.Join(t.TempDir(), "epoch-0")
	var calls [][2]uint64
	m, err := Write(ctx, log, allParts(log), dir, func(done, total uint64) { calls = append(calls, [2]uint64{done, total}) })
	if err != nil {
		t.Fatal(err)
	}
	s, err := log.JS.Stream(ctx, log.Stream)
	if err != nil {
		t.Fatal(err)
	}
	st := s.CachedInfo().State
	if p := m.Parts[0]; len(m.Parts) != 1 || p.Count != st.Msgs || p.FirstSeq != 1 || p.LastSeq != st.LastSeq || p.Stream != log.Stream ||
		m.Epoch != "0" || m.Shards != 1 || m.Stream != log.Stream || m.Subjects != log.Subjects.Root || m.Events() != st.Msgs {
		t.Fatalf("manifest %+v for stream state %+v", m, st)
	}
	if last := calls[len(calls)-1]; last != [2]uint64{st.Msgs, st.Msgs} {
		t.Fatalf("progress calls %v, want the last (%d, %d)", calls, st.Msgs, st.Msgs)
	}

	t.Run("FilesArePrivate", func(t *testing.T) {
		requirePrivate(t, dir)
	})

	t.Run("Verify", func(t *testing.T) {
		got, err := Verify(dir)
		if err != nil {
			t.Fatal(err)
		}
		if a, b := jsonOf(t, got), jsonOf(t, m); a != b {
			t.Fatalf("Verify's manifest\n%s\nWrite's\n%s", a, b)
		}
	})

	t.Run("ReadsAsTheLiveLog", func(t *testing.T) {
		a, err := Open(dir)
		if err != nil {
			t.Fatal(err)
		}
		sameReaders(t, log, a, []string{tr.roots[0], tr.children[0], tr.canceled[0], tr.roots[199], tr.children[39]})
	})

	t.Run("CheckLive", func(t *testing.T) {
		if err := CheckLive(ctx, log, m); err != nil {
			t.Fatal(err)
		}
		short := m
		short.Parts = slices.Clone(m.Parts)
		short.Parts[0].LastSeq--
		short.Parts[0].Count--
		if err := CheckLive(ctx, log, short); !errors.Is(err, ErrLiveMismatch) {
			t.Fatalf("CheckLive of a manifest one event short: %v, want ErrLiveMismatch", err)
		}
		other := m
		other.Parts = slices.Clone(m.Parts)
		head := *m.Parts[0].Head
		head.Hash[0] ^= 1
		other.Parts[0].Head = &head
		if err := CheckLive(ctx, log, other); !errors.Is(err, ErrLiveMismatch) {
			t.Fatalf("CheckLive of another chain head: %v, want ErrLiveMismatch", err)
		}
	})

	t.Run("DirectoryNotEmpty", func(t *testing.T) {
		if _, err := Write(ctx, log, allParts(log), dir, nil); !errors.Is(err, ErrNotEmpty) {
			t.Fatalf("Write over an archive: %v, want ErrNotEmpty", err)
		}
		if _, err := Verify(dir); err != nil {
			t.Fatalf("the refused Write changed the archive: %v", err)
		}
		empty := t.TempDir()
		if _, err := Write(ctx, log, allParts(log), empty, nil); err != nil {
			t.Fatalf("Write into an empty directory: %v", err)
		}
		if _, err := Verify(empty); err != nil {
			t.Fatal(err)
		}
	})

	t.Run("Damage", func(t *testing.T) {
		damage(t, dir, m)
	})
}

func TestArchiveSharded(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	log, tr := writeLog(t, 3)
	seal(t, log)
	dir := filepath.Join(t.TempDir(), "epoch-0")
	m, err := Write(ctx, log, allParts(log), dir, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := Verify(dir); err != nil {
		t.Fatal(err)
	}
	for i, p := range m.Parts {
		if p.Part != i || p.Stream != fmt.Sprintf("%s_%d", log.Stream, i) || p.File != fileName(i) {
			t.Fatalf("part %d: %+v", i, p)
		}
	}
	if err := CheckLive(ctx, log, m); err != nil {
		t.Fatal(err)
	}
	a, err := Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	sameReaders(t, log, a, append(slices.Clone(tr.roots[:10]), tr.children[:10]...))

	t.Run("OnePart", func(t *testing.T) {
		one := filepath.Join(t.TempDir(), "part-2")
		m, err := Write(ctx, log, Epoch{Name: "2", Parts: []int{2}}, one, nil)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := Verify(one); err != nil {
			t.Fatal(err)
		}
		if err := CheckLive(ctx, log, m); err != nil {
			t.Fatal(err)
		}
		a, err := Open(one)
		if err != nil {
			t.Fatal(err)
		}
		got := archived(t, a)
		if want := liveEvents(t, log, []int{2}); len(want) == 0 || !reflect.DeepEqual(got, want) {
			t.Fatalf("part 2's archive holds %d events, the live part %d", len(got), len(want))
		}
	})

	t.Run("BadEpoch", func(t *testing.T) {
		for _, e := range []Epoch{{Name: "x", Parts: []int{3}}, {Name: "x", Parts: []int{1, 1}}, {Name: "", Parts: []int{0}}, {Name: "x"}} {
			if _, err := Write(ctx, log, e, filepath.Join(t.TempDir(), "a"), nil); err == nil {
				t.Fatalf("Write of epoch %+v succeeded", e)
			}
		}
	})
}

// damage checks that Verify finds each kind of damage to a copy of the
// archive at dir, naming the part and where.
func damage(t *testing.T, dir string, m Manifest) {
	p := m.Parts[0]
	file := func(d string) string { return filepath.Join(d, p.File) }
	edit := func(t *testing.T, d string, f func([]byte) []byte) {
		b, err := os.ReadFile(file(d))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(file(d), f(b), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	var lastRecord []byte // the file's last record, from its length on
	b, err := os.ReadFile(file(dir))
	if err != nil {
		t.Fatal(err)
	}
	for off := len(magic); off < len(b); {
		n := int(binary.LittleEndian.Uint32(b[off:]))
		lastRecord, off = b[off:off+4+n], off+4+n
	}
	appended := slices.Clone(lastRecord)
	binary.LittleEndian.PutUint64(appended[4:], p.LastSeq+1)

	for _, c := range []struct {
		name, want string
		damage     func(t *testing.T, d string)
	}{
		{"FlippedByte", "part 0", func(t *testing.T, d string) {
			edit(t, d, func(b []byte) []byte { b[len(b)/2] ^= 0x40; return b })
		}},
		{"FlippedLastByte", "part 0", func(t *testing.T, d string) {
			edit(t, d, func(b []byte) []byte { b[len(b)-1] ^= 0x01; return b })
		}},
		{"TruncatedMidRecord", "cut short", func(t *testing.T, d string) {
			edit(t, d, func(b []byte) []byte { return b[:len(b)-10] })
		}},
		{"LastRecordRemoved", fmt.Sprintf("after sequence %d: the file ends after %d events", p.LastSeq-1, p.Count-1), func(t *testing.T, d string) {
			edit(t, d, func(b []byte) []byte { return b[:len(b)-len(lastRecord)] })
		}},
		{"RecordAppended", fmt.Sprintf("sequence %d past the manifest's last", p.LastSeq+1), func(t *testing.T, d string) {
			edit(t, d, func(b []byte) []byte { return append(b, appended...) })
		}},
		{"HugeLength", "a record of 4294967295 bytes", func(t *testing.T, d string) {
			edit(t, d, func(b []byte) []byte { binary.LittleEndian.PutUint32(b[len(magic):], 0xffffffff); return b })
		}},
		{"PartFileRemoved", "part 0", func(t *testing.T, d string) {
			if err := os.Remove(file(d)); err != nil {
				t.Fatal(err)
			}
		}},
		{"ManifestEdited", "manifest.json", func(t *testing.T, d string) {
			mm := m
			mm.Parts = slices.Clone(m.Parts)
			mm.Parts[0].Count++
			writeManifest(t, d, mm)
		}},
		{"EventRemovedAndRechained", "names previous hash", func(t *testing.T, d string) {
			removeEvent(t, d, m)
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			d := copyDir(t, dir)
			c.damage(t, d)
			_, err := Verify(d)
			if err == nil || !strings.Contains(err.Error(), c.want) || c.name != "PartFileRemoved" && !errors.Is(err, ErrDamaged) {
				t.Fatalf("Verify: %v; want ErrDamaged naming %q", err, c.want)
			}
			// A forger's rewrite keeps the files consistent: only Verify's
			// event chain tells.
			if a, err := Open(d); err == nil && c.name != "EventRemovedAndRechained" {
				if err := a.Read(context.Background(), func(eventlog.Message) error { return nil }); !errors.Is(err, ErrDamaged) {
					t.Fatalf("Read of the damaged archive: %v, want ErrDamaged", err)
				}
			}
		})
	}
}

// removeEvent rewrites the archive at d without the second event of a
// task with three or more, renumbering the later records and updating
// the file's chain, hash and the manifest, as a forger would: only the
// events' own chain can tell.
func removeEvent(t *testing.T, d string, m Manifest) {
	t.Helper()
	p := m.Parts[0]
	r, err := openPart(d, p)
	if err != nil {
		t.Fatal(err)
	}
	var msgs []eventlog.Message
	for {
		rec, ok, err := r.next()
		if err != nil {
			t.Fatal(err)
		}
		if !ok {
			break
		}
		msgs = append(msgs, eventlog.Message{Pos: events.Position(rec.seq), Subject: rec.subject, Data: rec.data, Time: rec.time})
	}
	r.close()
	drop := -1
	for i, msg := range msgs {
		ev, err := events.Decode(msg.Data)
		if err != nil {
			t.Fatal(err)
		}
		if ev.Number == 2 && slices.ContainsFunc(msgs[i+1:], func(o eventlog.Message) bool { return o.Subject == msg.Subject }) {
			drop = i
			break
		}
	}
	if drop < 0 {
		t.Fatal("no task with three events")
	}
	msgs = slices.Delete(msgs, drop, drop+1)
	out := []byte(magic)
	p.Chain = Sum{}
	for i, msg := range msgs {
		rec := appendRecord(nil, p.FirstSeq+uint64(i), msg)
		p.Chain = chainNext(p.Chain, rec)
		out = append(out, rec...)
	}
	if err := os.WriteFile(filepath.Join(d, p.File), out, 0o644); err != nil {
		t.Fatal(err)
	}
	p.Count, p.LastSeq, p.Bytes, p.SHA256 = p.Count-1, p.LastSeq-1, int64(len(out)), Sum(sha256.Sum256(out))
	head := *p.Head
	head.Pos = events.Position(p.LastSeq)
	p.Head = &head
	m.Parts = []Part{p}
	writeManifest(t, d, m)
}

func writeManifest(t *testing.T, d string, m Manifest) {
	t.Helper()
	if err := os.WriteFile(filepath.Join(d, ManifestFile), []byte(jsonOf(t, m)), 0o644); err != nil {
		t.Fatal(err)
	}
}

func jsonOf(t *testing.T, v any) string {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func copyDir(t *testing.T, dir string) string {
	t.Helper()
	d := t.TempDir()
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		b, err := os.ReadFile(filepath.Join(dir, e.Name()))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(d, e.Name()), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return d
}

// archived returns every event of archive a, in its order.
func archived(t *testing.T, a *Archive) []events.Event {
	t.Helper()
	var got []events.Event
	if err := a.Events(context.Background(), func(ev events.Event) error {
		got = append(got, ev)
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	return got
}

// requirePrivate fails unless dir is 0700 and every file in it FileMode
// (an archive holds every tenant's events), whatever the umask.
func requirePrivate(t *testing.T, dir string) {
	t.Helper()
	info, err := os.Stat(dir)
	if err != nil {
		t.Fatal(err)
	}
	if perm := info.Mode().Perm(); perm != 0o700 {
		t.Errorf("archive directory mode %04o, want 0700", perm)
	}
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	if len(entries) < 2 {
		t.Fatalf("archive holds %d files", len(entries))
	}
	for _, e := range entries {
		info, err := e.Info()
		if err != nil {
			t.Fatal(err)
		}
		if perm := info.Mode().Perm(); perm != FileMode {
			t.Errorf("%s: mode %04o, want %04o", e.Name(), perm, FileMode)
		}
	}
}
