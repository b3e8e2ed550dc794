package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"path/filepath"
	"time"

	"github.com/taskledger/taskledger/events"
	"github.com/taskledger/taskledger/internal/chainkey"
	"github.com/taskledger/taskledger/replay"
)

// chainKeyFlag registers --chain-key-file: serve's and replay verify's.
func chainKeyFlag(fs *flag.FlagSet) *string {
	return fs.String("chain-key-file", "", "the log's chain key file (HMAC keys that sign every event; docs/operations.md, \"Chain key\"); default <data>/"+chainkey.FileName+"; serve creates it on a log without keyed events")
}

// chainKeyPath is the chain key file: flag, or the default in the data
// directory.
func chainKeyPath(flag string, nf natsFlags) string {
	if flag != "" {
		return flag
	}
	return filepath.Join(nf.data, chainkey.FileName)
}

// verifyChain returns the keyed chain's rule for replay verify of a log
// whose streams are named from base by shards: the key file's keys, or
// none when the file does not exist (a log that was never keyed; a keyed
// event is then reported as unverifiable).
func verifyChain(path, base string, shards events.Shards) (*replay.Chain, error) {
	f, err := chainkey.Load(path)
	if errors.Is(err, chainkey.ErrNoFile) {
		return replay.NewChain(nil, nil), nil
	}
	if err != nil {
		return nil, err
	}
	kr, err := f.Keyring()
	if err != nil {
		return nil, err
	}
	return replay.NewChain(kr, f.Parts(base, shards)), nil
}

// chainKeyCommand is `taskledger chain-key rotate`: add a new key to the
// key file; the processes that read it sign with it from their next start.
func chainKeyCommand(_ context.Context, args []string, stdout io.Writer) error {
	if len(args) == 0 || args[0] != "rotate" {
		return fmt.Errorf("%w: chain-key rotate [--chain-key-file FILE | --data DIR]", errUsage)
	}
	fs := newFlagSet("chain-key rotate")
	data := fs.String("data", "./data", "data directory whose "+chainkey.FileName+" to rotate")
	path := fs.String("chain-key-file", "", "the key file (default <data>/"+chainkey.FileName+")")
	if err := parse(fs, args[1:]); err != nil {
		return err
	}
	if *path == "" {
		*path = filepath.Join(*data, chainkey.FileName)
	}
	f, err := chainkey.Rotate(*path, time.Now())
	if err != nil {
		return err
	}
	k := f.Keys[len(f.Keys)-1]
	fmt.Fprintf(stdout, "%s: added chain key %d (%d keys); it signs from each process's next start: copy the file to every process of the log, restart them, and back it up\n", *path, k.ID, len(f.Keys))
	return nil
}
