package main

import (
	"syscall"

	"github.com/rs/zerolog"
)

// warnFDLimit warns when the open-file limit leaves too little room for
// maxConns connections beside the embedded NATS server's files.
func warnFDLimit(log zerolog.Logger, maxConns int) {
	var lim syscall.Rlimit
	if maxConns <= 0 || syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim) != nil {
		return
	}
	const reserve = 512 // NATS, the store's files, the log
	if lim.Cur < uint64(maxConns)+reserve {
		log.Warn().Uint64("ulimitN", lim.Cur).Int("maxConns", maxConns).
			Msg("the open-file limit is below --max-conns plus 512: raise ulimit -n or lower --max-conns, or the process may run out of file descriptors before the cap refuses connections")
	}
}
