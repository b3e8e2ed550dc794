package scheduler_test

import (
	"github.com/taskledger/taskledger/internal/scheduler"
	"github.com/taskledger/taskledger/projections"
)

// The projection engine serves every view the service's parts declare.
var (
	_ scheduler.Views         = (*projections.Engine)(nil)
	_ scheduler.ScheduleViews = (*projections.Engine)(nil)
	_ scheduler.Usage         = (*projections.Engine)(nil)
)
