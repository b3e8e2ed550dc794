package scheduler_test

import (
	"testing"

	"github.com/taskledger/taskledger/internal/testnats"
)

func TestMain(m *testing.M) { testnats.Main(m) }
