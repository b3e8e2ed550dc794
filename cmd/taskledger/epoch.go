package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"path/filepath"
	"strconv"
	"text/tabwriter"
	"time"

	"github.com/taskledger/taskledger/internal/archive"
	"github.com/taskledger/taskledger/internal/eventlog"
	"github.com/taskledger/taskledger/internal/store"
)

// epochCommand is `epoch list` and `epoch remove EPOCH --archive DIR`.
func epochCommand(ctx context.Context, args []string, stdout io.Writer) error {
	if len(args) == 0 {
		return fmt.Errorf("%w: epoch list | epoch remove EPOCH --archive DIR", errUsage)
	}
	switch args[0] {
	case "list":
		return epochListCommand(ctx, args[1:], stdout)
	case "remove":
		return epochRemoveCommand(ctx, args[1:], stdout)
	}
	return fmt.Errorf("%w: unknown epoch command %q (list, remove)", errUsage, args[0])
}

// epochs opens the log the offline flags name and reads its epochs.
func (o *offline) epochs(ctx context.Context) (eventlog.Log, eventlog.Epochs, func(), error) {
	log, closeLog, err := o.openLog(ctx)
	if err != nil {
		return eventlog.Log{}, eventlog.Epochs{}, nil, err
	}
	e, ok, err := eventlog.ReadEpochs(ctx, log.JS, log.Stream)
	if err == nil && !ok {
		err = fmt.Errorf("%s was created without epochs (serve --epoch-slots): it has one, epoch 0", log.Stream)
	}
	if err != nil {
		closeLog()
		return eventlog.Log{}, eventlog.Epochs{}, nil, err
	}
	return log, e, closeLog, nil
}

func epochListCommand(ctx context.Context, args []string, stdout io.Writer) error {
	fs := newFlagSet("epoch list")
	var off offline
	off.register(fs)
	asJSON := fs.Bool("json", false, "print the epochs entry as JSON")
	if err := parse(fs, args); err != nil {
		return err
	}
	_, e, closeLog, err := off.epochs(ctx)
	if err != nil {
		return err
	}
	defer closeLog()
	if *asJSON {
		return printJSON(stdout, e)
	}
	tw := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "SLOT\tEPOCH\tSTATE\tPERIOD\tOPENED\tSEALED")
	for i, s := range e.Slots {
		epoch, period, current := "-", "-", ""
		if s.State != eventlog.SlotFree {
			from := time.Unix(0, s.Epoch*int64(e.Period)).UTC()
			epoch, period = strconv.FormatInt(s.Epoch, 10), from.Format(time.RFC3339)+" – "+from.Add(e.Period).Format(time.RFC3339)
		}
		if i == e.Current {
			current = " (current)"
		}
		fmt.Fprintf(tw, "%d\t%s\t%s%s\t%s\t%s\t%s\n", i, epoch, s.State, current, period, when(s.Opened), when(s.Sealed))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	fmt.Fprintf(stdout, "period %s; removed epochs: %v\n", e.Period, e.Removed)
	return nil
}

// when formats t, "-" for the zero time.
func when(t time.Time) string {
	if t.IsZero() {
		return "-"
	}
	return t.UTC().Format(time.RFC3339)
}

// epochRemoveCommand is `epoch remove EPOCH --archive DIR`: it verifies
// the archive whole, checks it against the sealed streams, and only then
// removes them (eventlog.RemoveEpoch).
func epochRemoveCommand(ctx context.Context, args []string, stdout io.Writer) error {
	fs := newFlagSet("epoch remove")
	var off offline
	off.register(fs)
	dir := fs.String("archive", "", "the epoch's archive (taskledger archive EPOCH --to DIR), verified against the log before anything is removed")
	name, err := oneArg(fs, args, "epoch number")
	if err != nil {
		return err
	}
	n, err := strconv.ParseInt(name, 10, 64)
	if err != nil || *dir == "" {
		return fmt.Errorf("%w: epoch remove EPOCH --archive DIR, EPOCH a number (taskledger epoch list)", errUsage)
	}
	m, err := archive.Verify(*dir)
	if err != nil {
		return err
	}
	if m.Epoch != name {
		return fmt.Errorf("the archive in %s is of epoch %s, not %s", *dir, m.Epoch, name)
	}
	log, e, closeLog, err := off.epochs(ctx)
	if err != nil {
		return err
	}
	defer closeLog()
	if slot, ok := e.SlotOfEpoch(n); ok && e.Slots[slot].State == eventlog.SlotSealed && e.Slots[slot].NextSeqs != nil {
		// A removal of this epoch stopped half way: some of its streams
		// may be gone already, so the archive is checked against what
		// is left of them and the sequences and chain heads that removal
		// recorded.
		err = archive.CheckRemoval(ctx, log, m, e.Slots[slot], log.Shards.SlotParts(slot))
	} else {
		err = archive.CheckLive(ctx, log, m)
	}
	if err != nil {
		return err
	}
	// The Runs go with the epoch's events once the archive holds them
	// and they match the digests its events record; an archive without
	// them leaves them in the runs bucket.
	runTasks, archivedRuns, err := verifyArchivedRuns(ctx, *dir, m, stdout)
	if err != nil {
		return err
	}
	if err := eventlog.RemoveEpoch(ctx, log, n); err != nil {
		return err
	}
	fmt.Fprintf(stdout, "removed epoch %d of %s (%d events, archived in %s)\n", n, log.Stream, m.Events(), *dir)
	if !archivedRuns {
		fmt.Fprintf(stdout, "the archive holds no Runs (%s): the epoch's Runs stay in the runs bucket\n", runsFile)
		return nil
	}
	runs, err := store.LookupRuns(ctx, log.JS, log.Stream)
	if errors.Is(err, store.ErrNoRun) {
		return nil
	}
	if err == nil {
		err = runs.Remove(ctx, runTasks)
	}
	if err != nil {
		return fmt.Errorf("epoch %d removed; removing its Runs failed, they stay in the runs bucket: %w", n, err)
	}
	fmt.Fprintf(stdout, "removed the Runs of %d tasks (archived in %s)\n", len(runTasks), filepath.Join(*dir, runsFile))
	return nil
}
