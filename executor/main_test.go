package executor_test

import (
	"os"
	"testing"

	"github.com/taskledger/taskledger/internal/testnats"
)

func TestMain(m *testing.M) {
	if os.Getenv(killChildEnv) != "" { // a child executor of TestKillNineExecutor
		os.Exit(killChild())
	}
	testnats.Main(m)
}
