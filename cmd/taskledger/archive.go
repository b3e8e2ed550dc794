package main

import (
	"context"
	"fmt"
	"io"
	"path/filepath"
	"strconv"
	"time"

	"github.com/taskledger/taskledger/internal/archive"
	"github.com/taskledger/taskledger/internal/eventlog"
)

// archiveCommand is `archive EPOCH --to DIR` and `archive verify DIR`.
func archiveCommand(ctx context.Context, args []string, stdout io.Writer) error {
	if len(args) > 0 && args[0] == "verify" {
		return archiveVerifyCommand(ctx, args[1:], stdout)
	}
	fs := newFlagSet("archive")
	var off offline
	off.register(fs)
	to := fs.String("to", "", "directory to write the archive into; it must not exist, or be empty")
	name, err := oneArg(fs, args, "epoch name")
	if err != nil {
		return err
	}
	if *to == "" {
		return fmt.Errorf("%w: archive EPOCH --to DIR", errUsage)
	}
	log, closeLog, err := off.openLog(ctx)
	if err != nil {
		return err
	}
	defer closeLog()
	epoch, err := resolveEpoch(ctx, log, name)
	if err != nil {
		return err
	}
	bar := newProgress("archive")
	m, err := archive.Write(ctx, log, epoch, *to, bar.update)
	bar.done()
	if err != nil {
		return err
	}
	fmt.Fprintf(stdout, "archived epoch %s of %s: %d parts, %d events to %s\n", m.Epoch, m.Stream, len(m.Parts), m.Events(), *to)
	printParts(stdout, m)
	n, err := archiveRuns(ctx, log, *to)
	if err != nil {
		return err
	}
	fmt.Fprintf(stdout, "runs: %d stored Run revisions to %s\n", n, filepath.Join(*to, runsFile))
	return nil
}

// resolveEpoch returns the epoch of log that name names: for a log with
// epochs a live one by its number (taskledger epoch list), for a log
// without, "0", made of all its parts.
func resolveEpoch(ctx context.Context, log eventlog.Log, name string) (archive.Epoch, error) {
	e, ok, err := eventlog.ReadEpochs(ctx, log.JS, log.Stream)
	if err != nil {
		return archive.Epoch{}, err
	}
	if !ok {
		if name != "0" {
			return archive.Epoch{}, fmt.Errorf("epoch %q: the log has no epochs, only epoch 0 (all of it)", name)
		}
		parts := make([]int, log.Shards.N())
		for i := range parts {
			parts[i] = i
		}
		return archive.Epoch{Name: name, Parts: parts}, nil
	}
	n, err := strconv.ParseInt(name, 10, 64)
	if err != nil {
		return archive.Epoch{}, fmt.Errorf("%w: epoch %q: want an epoch number (taskledger epoch list)", errUsage, name)
	}
	slot, ok := e.SlotOfEpoch(n)
	if !ok {
		return archive.Epoch{}, fmt.Errorf("epoch %d: no live epoch has this number (taskledger epoch list)", n)
	}
	from := time.Unix(0, n*int64(e.Period)).UTC()
	return archive.Epoch{Name: name, Parts: log.Shards.SlotParts(slot), From: from, To: from.Add(e.Period)}, nil
}

// archiveVerifyCommand is `archive verify DIR [--live]`.
func archiveVerifyCommand(ctx context.Context, args []string, stdout io.Writer) error {
	fs := newFlagSet("archive verify")
	var off offline
	off.register(fs)
	live := fs.Bool("live", false, "also check that the log's sealed streams (--data or --nats-url) still hold exactly what the archive does")
	dir, err := oneArg(fs, args, "archive directory")
	if err != nil {
		return err
	}
	m, err := archive.Verify(dir)
	if err != nil {
		return err
	}
	fmt.Fprintf(stdout, "archive %s: epoch %s of %s, %d parts, %d events: verified\n", dir, m.Epoch, m.Stream, len(m.Parts), m.Events())
	printParts(stdout, m)
	if !*live {
		return nil
	}
	log, closeLog, err := off.openLog(ctx)
	if err != nil {
		return err
	}
	defer closeLog()
	if err := archive.CheckLive(ctx, log, m); err != nil {
		return err
	}
	fmt.Fprintln(stdout, "the live streams are sealed and hold exactly the archive's events")
	return nil
}

func printParts(w io.Writer, m archive.Manifest) {
	for _, p := range m.Parts {
		fmt.Fprintf(w, "part %d %s: sequences %d to %d, %d events, %d bytes", p.Part, p.Stream, p.FirstSeq, p.LastSeq, p.Count, p.Bytes)
		if p.Head != nil {
			fmt.Fprintf(w, ", chain head %d sha256 %x", p.Head.Pos, p.Head.Hash)
		}
		fmt.Fprintln(w)
	}
}
