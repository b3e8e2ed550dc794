// Command taskledger runs the scheduler (serve) and talks to a running one
// (schedule, show, list, cancel, retry, history, tree, run). `taskledger help` lists the
// subcommands; `taskledger CMD -h` lists a subcommand's flags.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"syscall"
	_ "time/tzdata" // the zone database, for schedules' timezones on machines without one

	"github.com/taskledger/taskledger/internal/bench"
)

// command is one subcommand.
type command struct {
	name  string
	usage string
	run   func(ctx context.Context, args []string, stdout io.Writer) error
}

var commands = []command{
	{"serve", "run the scheduler with an embedded NATS server (or --nats-url)", serveCommand},
	{"schedule", "schedule a task", scheduleCommand},
	{"show", "show one task: show ID", showCommand},
	{"list", "list tasks", listCommand},
	{"cancel", "cancel a task: cancel ID", cancelCommand},
	{"release", "hand a running task's claim back, for any executor to resume it: release ID", releaseCommand},
	{"retry", "schedule a finished task again as a new task: retry ID [--message text] [--request-id key]", retryCommand},
	{"history", "show a task's event history: history ID", historyCommand},
	{"concurrency", "show a concurrency key's holders and waiters: concurrency KEY", concurrencyCommand},
	{"tree", "show a task's lineage from its root: tree ID", treeCommand},
	{"schedules", "periodic schedules: schedules create|list|show|pause|resume|trigger|delete|history", schedulesCommand},
	{"events", "follow the live event stream (resumes with --after)", eventsCommand},
	{"stats", "show queue statistics per customer and queue", statsCommand},
	{"run", "show a task's Run state (phase, turn, transcript, tools, effects): run ID [--revision N] [--follow]", runStateCommand},
	{"archive", "write a sealed epoch to a directory, or check one: archive EPOCH --to DIR | archive verify DIR", archiveCommand},
	{"epoch", "a log's epochs: epoch list | epoch remove EPOCH --archive DIR (after archive verify)", epochCommand},
	{"replay", "offline log tools: replay verify | replay rebuild | replay quarantine (--data or --nats-url)", replayCommand},
	{"chain-key", "the log's chain key file: chain-key rotate (add a key that signs from the next start)", chainKeyCommand},
	{"work", "reference executor: claim tasks of --queue and run --exec per task", workCommand},
	{"bench", "measure this machine against the raw JetStream ceiling (--scale, --json; --markdown renders a --json report)", benchCommand},
}

// errUsage marks a command-line mistake: exit code 2.
var errUsage = errors.New("usage")

func main() {
	bench.PollsChild() // a child process the bench started for its polls
	guardChild()       // a child process the worker started for a command
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx, os.Args[1:], os.Stdout)
	stop()
	switch {
	case err == nil, errors.Is(err, flag.ErrHelp):
	case errors.Is(err, errUsage):
		fmt.Fprintln(os.Stderr, "taskledger:", err)
		os.Exit(2)
	default:
		fmt.Fprintln(os.Stderr, "taskledger:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, args []string, stdout io.Writer) error {
	if len(args) == 0 || args[0] == "help" || args[0] == "-h" || args[0] == "--help" {
		printUsage(os.Stderr)
		if len(args) == 0 {
			return errUsage
		}
		return nil
	}
	for _, c := range commands {
		if c.name == args[0] {
			return c.run(ctx, args[1:], stdout)
		}
	}
	printUsage(os.Stderr)
	return fmt.Errorf("%w: unknown command %q", errUsage, args[0])
}

func printUsage(w io.Writer) {
	fmt.Fprintln(w, "usage: taskledger COMMAND [flags]\n\ncommands:")
	for _, c := range commands {
		fmt.Fprintf(w, "  %-9s %s\n", c.name, c.usage)
	}
	fmt.Fprintln(w, "\nEvery flag can also be set as TASKLEDGER_<FLAG> (e.g. TASKLEDGER_NATS_URL).")
}

// newFlagSet returns a FlagSet for a subcommand.
func newFlagSet(name string) *flag.FlagSet {
	return flag.NewFlagSet("taskledger "+name, flag.ContinueOnError)
}

// parse parses args after applying TASKLEDGER_<FLAG> environment
// variables as defaults, so the command line wins over the environment.
func parse(fs *flag.FlagSet, args []string) error {
	var envErr error
	fs.VisitAll(func(f *flag.Flag) {
		key := "TASKLEDGER_" + strings.ToUpper(strings.ReplaceAll(f.Name, "-", "_"))
		if v, ok := os.LookupEnv(key); ok {
			if err := f.Value.Set(v); err != nil && envErr == nil {
				envErr = fmt.Errorf("%w: %s=%q: %w", errUsage, key, v, err)
			}
		}
	})
	if envErr != nil {
		return envErr
	}
	if err := fs.Parse(args); err != nil {
		return fmt.Errorf("%w: %w", errUsage, err)
	}
	return nil
}
