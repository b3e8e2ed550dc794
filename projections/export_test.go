package projections

// DropTimer takes task id out of timer queue t, as a projection that
// lost it would be: for tests of Repair.
func (e *Engine) DropTimer(t Timer, id string) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.v.timers[t].remove(id)
}
