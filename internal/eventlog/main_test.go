package eventlog_test

import (
	"testing"

	"github.com/taskledger/taskledger/internal/testnats"
	"github.com/taskledger/taskledger/internal/testnode"
)

// schedule appends a root task (the shared harness's).
var schedule = testnode.ScheduleRoot

func TestMain(m *testing.M) { testnats.Main(m) }
