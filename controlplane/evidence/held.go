package evidence

import dto "github.com/prometheus/client_model/go"

// HeldForReadLag is smg_liveness_held_for_read_lag_workers as the last sweep
// set it, read from the gauge alone: a caller sampling it often (the scale
// harness, 4 times a second) must not gather every metric of a 10,000-worker
// registry each time.
func (in *Inbox) HeldForReadLag() float64 {
	var m dto.Metric
	if err := in.held.Write(&m); err != nil {
		return 0
	}
	return m.GetGauge().GetValue()
}
