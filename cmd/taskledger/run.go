package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"slices"
	"strings"
	"text/tabwriter"

	"github.com/taskledger/taskledger/api"
)

// runStateCommand prints a task's Run document: `taskledger run ID`,
// one revision of it (--revision N), or follows it live (--follow).
func runStateCommand(ctx context.Context, args []string, stdout io.Writer) error {
	fs := newFlagSet("run")
	var cf clientFlags
	cf.register(fs)
	revision := fs.Uint64("revision", 0, "show this revision of the Run (from 1; 0: the latest)")
	follow := fs.Bool("follow", false, "follow the Run live: each saved revision's new transcript items and each progress line, until the task ends")
	id, err := oneID(fs, args)
	if err != nil {
		return err
	}
	if *follow {
		return followRun(ctx, cf.client(), id, stdout)
	}
	raw, err := cf.client().GetRunRevisionJSON(ctx, id, *revision)
	if err != nil {
		return err
	}
	if cf.json {
		var out bytes.Buffer
		if err := json.Indent(&out, raw, "", "  "); err != nil {
			return err
		}
		out.WriteByte('\n')
		_, err := out.WriteTo(stdout)
		return err
	}
	var d api.RunDocument
	if err := json.Unmarshal(raw, &d); err != nil {
		return fmt.Errorf("run of %s: %w", id, err)
	}
	printRun(stdout, d)
	return nil
}

// followRun prints task id's run stream for a person: a line for each
// saved revision and each of its new transcript items, the progress
// text as it comes, and the task's end.
func followRun(ctx context.Context, c *api.Client, id string, w io.Writer) error {
	midLine := false // progress text ended without a newline
	line := func(format string, args ...any) {
		if midLine {
			fmt.Fprintln(w)
			midLine = false
		}
		fmt.Fprintf(w, format+"\n", args...)
	}
	return c.StreamRun(ctx, id, 0, func(it api.RunStreamItem) error {
		switch {
		case it.Change != nil:
			ch := it.Change
			phase := ""
			if p, ok := ch.Set["phase"]; ok {
				phase = " phase " + string(p)
			}
			line("revision %d saved %s%s", ch.Revision, stamp(ch.SavedAt), phase)
			if ch.Transcript != nil {
				for _, item := range ch.Transcript.Append {
					line("  %s\t%s\tturn %d\t%s", item.ID, item.Kind, item.Turn, itemText(item))
				}
			}
		case it.Progress != nil:
			fmt.Fprint(w, it.Progress.Text)
			midLine = !strings.HasSuffix(it.Progress.Text, "\n")
		case it.End != nil:
			line("ended: %s", it.End.Status)
		}
		return nil
	})
}

// printRun writes d for a person: the header rows, then one line per
// transcript item, pending tool, context, effect and child.
func printRun(w io.Writer, d api.RunDocument) {
	r := d.Run
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	row := func(k, v string) {
		if v != "" {
			fmt.Fprintf(tw, "%s\t%s\n", k, v)
		}
	}
	row("task", d.TaskID)
	row("revision", fmt.Sprint(d.Revision))
	row("updated", stamp(d.UpdatedAt))
	row("delivery", d.DeliveryID)
	row("executor", r.ExecutorID)
	row("phase", r.Phase)
	row("turn", fmt.Sprint(r.Turn))
	row("steps", strings.Join(r.Steps, ", "))
	contexts := make([]string, 0, len(r.Contexts))
	for _, name := range slices.Sorted(maps.Keys(r.Contexts)) {
		contexts = append(contexts, fmt.Sprintf("%s@%d", name, r.Contexts[name].Version))
	}
	row("contexts", strings.Join(contexts, ", "))
	tw.Flush()
	section := func(title string, n int, line func(i int) string) {
		if n == 0 {
			return
		}
		fmt.Fprintf(w, "%s:\n", title)
		tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
		for i := range n {
			fmt.Fprintf(tw, "  %s\n", line(i))
		}
		tw.Flush()
	}
	section("transcript", len(r.Transcript), func(i int) string {
		it := r.Transcript[i]
		return fmt.Sprintf("%s\t%s\tturn %d\t%s", it.ID, it.Kind, it.Turn, itemText(it))
	})
	section("pending tools", len(r.PendingTools), func(i int) string {
		return toolText(r.PendingTools[i])
	})
	effects := slices.Sorted(maps.Keys(r.Effects))
	section("effects", len(effects), func(i int) string {
		e := r.Effects[effects[i]]
		s := effects[i] + "\tintent"
		if o := e.Outcome; o != nil {
			s = strings.TrimSpace(fmt.Sprintf("%s\t%s %s %s", effects[i], o.Kind, o.Ref, o.URL))
		}
		if e.Uncertain {
			s += " (uncertain)"
		}
		return s
	})
	children := slices.Sorted(maps.Keys(r.Children))
	section("children", len(children), func(i int) string {
		return children[i] + "\t" + r.Children[children[i]]
	})
}

// itemText is a transcript item's short text: its content, or its tool.
func itemText(it api.TranscriptItem) string {
	if s := messageText(it.Content); s != "" || it.Tool == nil {
		return s
	}
	return it.Tool.Name + " " + it.Tool.Status
}

func toolText(c api.ToolCall) string {
	return fmt.Sprintf("%s\t%s\tturn %d\t%s", c.ID, c.Name, c.Turn, c.Status)
}

// printRunSummary ends a task's history with its run's phase, turn and
// pending tools, when it has a run.
func printRunSummary(ctx context.Context, w io.Writer, c *api.Client, id string) error {
	d, err := c.GetRun(ctx, id)
	if errors.Is(err, api.ErrNotFound) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("run of %s: %w", id, err)
	}
	pending := make([]string, len(d.Run.PendingTools))
	for i, p := range d.Run.PendingTools {
		pending[i] = p.ID + " " + p.Name
	}
	fmt.Fprintf(w, "run (revision %d, %s): phase=%q turn=%d pending tools: %d\n", d.Revision, stamp(d.UpdatedAt), d.Run.Phase, d.Run.Turn, len(pending))
	for _, p := range pending {
		fmt.Fprintf(w, "  %s\n", p)
	}
	return nil
}
