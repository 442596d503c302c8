// Package judge holds the pure rules of overload protection: functions of
// (evidence, thresholds, now) → verdict. It starts no goroutine, reads no
// clock, does no I/O, logs nothing and owns no metric; every call returns what
// changed so the caller (the control plane) can log, count and commit it.
//
// Where each rule of docs/overload-protection.md lives:
//
//	Signals (waiting >= threshold or mean token usage >= threshold)   Check
//	When a Worker Does Not Report (fail open)                         the registry: no Check while Evidence.NoReport
//	Gateway Thresholds (flags, defaults, ranges)                      GatewayThresholds.AddFlags, .Validate
//	--disable-worker-overload-protection                              GatewayThresholds.Resolve
//	Per-Worker Thresholds (block validation, per-signal fallback)     Block.Validate, GatewayThresholds.Resolve
//	--worker-stall-secs / --worker-wedge-secs / --worker-stale-secs   LivenessConfig.AddFlags, .Validate, .Rules
//	When a Worker Dies or Loses Its Link (unreachable)                Liveness.Failure, Liveness.Contact, Liveness.Sweep
//	  connection failures only; deadlines and engine errors ignored   FailureKind
//	  any successful contact clears it                                Liveness.Contact, .Record, .Routers
//	  stall 0 removes the silence requirement                         Rules.Stall
//	When an Engine Freezes (wedged)                                   Liveness.Sweep
//	  wedge bound (prefill in flight / measured rate, capped 120 s)   Liveness.Routers, Liveness.SetPrefillRate
//	  no stretch while the engine itself runs nothing                 Record.Idle
//	  a waiting queue without progress                                Liveness.Record + Liveness.Routers
//	  a pile that grows or stands DeepPile deep                       Liveness.Routers
//	  the engine's own silence, per wire                              Record.Silence, Record.StepWire
//	  every way the veto ends                                         Liveness.Sweep (Cause says which)
//	When a Worker Goes Silent Entirely (stale → unreachable)          Record.Pushed, Liveness.Sweep
//	  silence the control plane has not read is not counted (capped)  Heard, StreamRead, Rules.ReadLag
//
// Leaving Ready, removal and replacement are the caller's business: the
// registry (registry.decide) drops the worker's Liveness and clears its
// overload flag in the transaction that commits the change. No verdict here touches
// the worker's health status.
//
// It imports no other smg package.
package judge
