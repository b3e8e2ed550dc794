package delivery

import (
	"testing"

	"github.com/taskledger/taskledger/internal/testnats"
)

func TestMain(m *testing.M) { testnats.Main(m) }
