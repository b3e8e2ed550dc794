package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"

	"github.com/taskledger/taskledger/api"
)

// scheduleFile schedules the tasks of an NDJSON file (one schedule body a
// line, blank lines skipped) through POST /v1/tasks/batch, in batches of
// at most api.MaxBatchItems and api.MaxBatchBodyBytes, and prints one
// line per task in file order. It fails if any task was refused, after
// sending them all.
func scheduleFile(ctx context.Context, cf clientFlags, path string, stdout io.Writer) error {
	in := os.Stdin
	if path != "-" {
		f, err := os.Open(path)
		if err != nil {
			return err
		}
		defer f.Close()
		in = f
	}
	client := cf.client()
	var (
		batch   []api.ScheduleRequest
		lines   []int // file line of each batch item
		size    int
		failed  int
		sent    int
		scanner = bufio.NewScanner(in)
	)
	scanner.Buffer(make([]byte, 0, 64<<10), api.MaxBodyBytes)
	flush := func() error {
		if len(batch) == 0 {
			return nil
		}
		items, err := client.ScheduleBatch(ctx, batch)
		if err != nil {
			return fmt.Errorf("tasks of lines %d to %d: %w", lines[0], lines[len(lines)-1], err)
		}
		for i, it := range items {
			if it.Err() != nil {
				failed++
			}
			if err := printItem(stdout, cf.json, lines[i], it); err != nil {
				return err
			}
		}
		sent += len(batch)
		batch, lines, size = batch[:0], lines[:0], 0
		return nil
	}
	for n := 1; scanner.Scan(); n++ {
		line := bytes.TrimSpace(scanner.Bytes())
		if len(line) == 0 {
			continue
		}
		var req api.ScheduleRequest
		dec := json.NewDecoder(bytes.NewReader(line))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&req); err != nil {
			return fmt.Errorf("%w: line %d: %w", errUsage, n, err)
		}
		// A batch body is the lines plus a little framing.
		if len(batch) == api.MaxBatchItems || size+len(line)+64 > api.MaxBatchBodyBytes {
			if err := flush(); err != nil {
				return err
			}
		}
		batch, lines, size = append(batch, req), append(lines, n), size+len(line)+1
	}
	if err := scanner.Err(); err != nil {
		return fmt.Errorf("reading %s: %w", path, err)
	}
	if err := flush(); err != nil {
		return err
	}
	if failed > 0 {
		return fmt.Errorf("%d of %d tasks were refused", failed, sent)
	}
	return nil
}

// printItem prints one batch item: a JSON line, or "LINE ID STATUS" /
// "LINE refused: ERROR".
func printItem(w io.Writer, asJSON bool, line int, it api.BatchItem) error {
	if asJSON {
		return json.NewEncoder(w).Encode(struct {
			Line int `json:"line"`
			api.BatchItem
		}{line, it})
	}
	var err error
	switch e := it.Err(); {
	case e != nil:
		_, err = fmt.Fprintf(w, "line %d refused: %v\n", line, e)
	case it.Status == 200:
		_, err = fmt.Fprintf(w, "line %d exists %s  status=%s\n", line, it.Task.ID, it.Task.Status)
	default:
		_, err = fmt.Fprintf(w, "line %d scheduled %s  status=%s queue=%s\n", line, it.Task.ID, it.Task.Status, it.Task.Queue)
	}
	return err
}
