package store

// CachedAs reports where the store's cache holds the task's state:
// "live", "finished" or "" (not cached).
func (s *Store) CachedAs(taskID string) string {
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.cache.live[taskID]; ok {
		return "live"
	}
	if _, ok := s.cache.finished[taskID]; ok {
		return "finished"
	}
	return ""
}
