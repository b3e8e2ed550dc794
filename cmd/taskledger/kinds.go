package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/taskledger/taskledger/api"
	"github.com/taskledger/taskledger/events"
)

// payloadFlag returns the parser of --payload: JSON text, or @FILE for a
// file's (@- for stdin), which must hold one JSON value. The server checks
// its size (events.MaxPayloadBytes, once compact).
func payloadFlag(dst *json.RawMessage) func(string) error {
	return func(v string) error {
		b := []byte(v)
		if name, ok := strings.CutPrefix(v, "@"); ok {
			var err error
			if b, err = readPayload(name); err != nil {
				return err
			}
		}
		if !json.Valid(b) {
			return fmt.Errorf("not one JSON value")
		}
		*dst = bytes.TrimSpace(b)
		return nil
	}
}

// readPayload reads a payload file (- for stdin), at most a request
// body's size.
func readPayload(name string) ([]byte, error) {
	r := io.Reader(os.Stdin)
	if name != "-" {
		f, err := os.Open(name)
		if err != nil {
			return nil, err
		}
		defer f.Close()
		r = f
	}
	b, err := io.ReadAll(io.LimitReader(r, api.MaxBodyBytes+1))
	if err == nil && len(b) > api.MaxBodyBytes {
		err = fmt.Errorf("%s is larger than %d bytes", name, api.MaxBodyBytes)
	}
	return b, err
}

// jsonText is a payload or an output for show: its compact JSON on one
// line, cut after 200 bytes (--json shows it whole); "" for none.
func jsonText(raw json.RawMessage) string {
	if len(raw) > 200 {
		return events.Truncate(string(raw), 197) + "..."
	}
	return string(raw)
}
