package gateway

import "time"

// SetDeliveryBudget bounds how long a trigger delivery's alerts are
// turned into runs before the answer goes, so that a test can have them
// kept and started after it.
func (s *Server) SetDeliveryBudget(d time.Duration) { s.budget = d }
