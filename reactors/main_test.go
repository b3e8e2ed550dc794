package reactors_test

import (
	"testing"

	"github.com/taskledger/taskledger/internal/testnats"
	"github.com/taskledger/taskledger/projections"
)

func TestMain(m *testing.M) { testnats.Main(m) }

// mustEngine is projections.New for configurations that are valid.
func mustEngine(cfg projections.Config) *projections.Engine {
	e, err := projections.New(cfg)
	if err != nil {
		panic(err)
	}
	return e
}
