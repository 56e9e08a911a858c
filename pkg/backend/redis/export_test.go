package redis

// WaitRefunds waits for the compensating refunds (and other background
// segments) the Store has started: tests read counters once they ran.
func (s *Store) WaitRefunds() { s.bg.Wait() }
