package evloop

// What a loop of both drivers says of its choice between them
// (adapt_linux.go); this file builds everywhere, for the user's reports.

// AdaptiveStats is what a loop on IOAdaptive says of its choice.
type AdaptiveStats struct {
	// OnIOUring says the loop serves on io_uring now (else epoll).
	OnIOUring bool
	// Load is the last measured mean of requests out at the upstreams.
	Load float64
	// Switches counts the changes of the choice, Moves the endpoints
	// moved between the drivers.
	Switches, Moves uint64
}
