package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"path/filepath"
	"slices"

	"github.com/taskledger/taskledger/events"
	"github.com/taskledger/taskledger/internal/archive"
	"github.com/taskledger/taskledger/internal/eventlog"
	"github.com/taskledger/taskledger/internal/store"
	"github.com/taskledger/taskledger/replay"
)

// runsFile is the file of an archive directory that holds the Runs of
// the epoch's tasks (store.ExportRuns): every revision the archived
// events record (RunSaved), checked against their digests by replay
// verify --archive and before epoch remove.
const runsFile = "runs.ndjson"

// archiveRuns writes the Runs of the tasks archived in dir into its
// runsFile, read from the log's runs bucket, and returns the records
// written. A log without a runs bucket has none to write.
func archiveRuns(ctx context.Context, log eventlog.Log, dir string) (int, error) {
	a, err := archive.Open(dir)
	if err != nil {
		return 0, err
	}
	tasks, err := runTasks(ctx, a)
	if err != nil {
		return 0, err
	}
	runs, err := store.LookupRuns(ctx, log.JS, log.Stream)
	if errors.Is(err, store.ErrNoRun) {
		runs, tasks = nil, nil
	} else if err != nil {
		return 0, err
	}
	tmp := filepath.Join(dir, runsFile+".tmp")
	f, err := archive.CreateFile(tmp)
	if err != nil {
		return 0, err
	}
	n := 0
	if runs != nil {
		n, err = runs.ExportRuns(ctx, f, tasks)
	}
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp, filepath.Join(dir, runsFile))
	}
	if err != nil {
		os.Remove(tmp)
		return 0, fmt.Errorf("archive runs: %w", err)
	}
	return n, nil
}

// runTasks returns the tasks whose Runs the archive's events record,
// each with its latest revision.
func runTasks(ctx context.Context, a *archive.Archive) (map[string]uint64, error) {
	tasks := map[string]uint64{}
	err := a.Events(ctx, func(ev events.Event) error {
		if p, ok := ev.Data.(events.RunSaved); ok {
			tasks[ev.TaskID] = max(tasks[ev.TaskID], p.Revision)
		}
		return nil
	})
	return tasks, err
}

// archivedRuns opens the runsFile of archive dir; ok is false for an
// archive without one (written before archives held Runs).
func archivedRuns(dir string) (runs replay.RunReader, ok bool, err error) {
	f, err := os.Open(filepath.Join(dir, runsFile))
	if errors.Is(err, os.ErrNotExist) {
		return nil, false, nil
	}
	if err != nil {
		return nil, false, err
	}
	defer f.Close()
	r, err := store.ReadRunArchive(f)
	return r, err == nil, err
}

// verifyArchivedRuns checks every Run revision the archive in dir
// records against its runsFile, as replay verify --archive does, and
// returns the tasks whose Runs it holds. ok is false for an archive
// without a runsFile.
func verifyArchivedRuns(ctx context.Context, dir string, a archive.Manifest, w io.Writer) (tasks []string, ok bool, err error) {
	runs, ok, err := archivedRuns(dir)
	if err != nil || !ok {
		return nil, ok, err
	}
	ar, err := archive.Open(dir)
	if err != nil {
		return nil, false, err
	}
	v := archiveVerifier(a)
	if err := ar.Read(ctx, func(m eventlog.Message) error { v.Add(m.Pos, m.Subject, m.Data); return nil }); err != nil {
		return nil, false, err
	}
	if err := v.VerifyRuns(ctx, runs); err != nil {
		return nil, false, err
	}
	var bad int
	for _, x := range v.Report().Violations {
		if x.Kind == replay.RunMismatch || x.Kind == replay.RunUnreadable {
			fmt.Fprintf(w, "seq %d task %s: %s: %s\n", x.Seq, x.TaskID, x.Kind, x.Detail)
			bad++
		}
	}
	if bad > 0 {
		return nil, true, fmt.Errorf("the archive's Runs do not match its events: %d revisions", bad)
	}
	all, err := runTasks(ctx, ar)
	return slices.Sorted(maps.Keys(all)), true, err
}
