package eventlog_test

import (
	"context"
	"testing"

	"github.com/taskledger/taskledger/aggregate"
	"github.com/taskledger/taskledger/events"
	"github.com/taskledger/taskledger/internal/store"
	"github.com/taskledger/taskledger/internal/testnats"
)

func TestMain(m *testing.M) { testnats.Main(m) }

// schedule appends a new root task of customer acme to st's log and
// returns its id.
func schedule(t *testing.T, st *store.Store) string {
	t.Helper()
	id := events.NewID()
	_, _, err := st.Execute(context.Background(), id, "", aggregate.Schedule{
		TaskID: id, CustomerID: "acme",
		Spec: events.TaskSpec{RootID: id, Queue: "default", TimeoutSeconds: 60},
	})
	if err != nil {
		t.Fatal(err)
	}
	return id
}
