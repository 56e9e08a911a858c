// Package configsource is where the rate-limit config of `ratelimitd serve`
// comes from: files, watched and reloaded on SIGHUP, or an xDS management
// server. Every load goes to the same apply (a config to put in force) or
// fail (a load that put nothing in force).
package configsource

import (
	"context"
	"log/slog"
	"os"

	"github.com/ratelimitd/ratelimitd/pkg/policy"
	"github.com/ratelimitd/ratelimitd/pkg/policy/xds"
	"github.com/ratelimitd/ratelimitd/pkg/service"
)

// Source is a config source: the files of Paths, or the xDS server of XDS.
type Source struct {
	Load  policy.LoadOptions // how every config is loaded
	Paths []string           // --config: files or directories, when XDS is nil
	XDS   *xds.Options       // --config-source=xds; nil: the files of Paths
	Log   *slog.Logger       // SIGHUP lines
}

// Apply receives a config loaded for being put in force.
type Apply = func(set *policy.Set, warnings []policy.Warning)

// Fail receives the error of a load that put nothing in force.
type Fail = func(err error)

// Capable returns load restricted to what the stores decide: a limit of an
// algorithm the store (or, for `store: durable` limits, the durable store)
// does not decide, or a penalty box it cannot decide atomically, is
// refused at load naming backend. durable is nil without a durable store,
// and `store: durable` limits are then refused.
func Capable(load policy.LoadOptions, backend string, store, durable service.Store) policy.LoadOptions {
	if al, ok := store.(service.AlgorithmLister); ok {
		// The config in force stays, and at startup the service is not
		// SERVING.
		load.Algorithms, load.Backend = al.Algorithms(), backend
	}
	if durable != nil {
		load.Durable.Enabled = true
		if al, ok := durable.(service.AlgorithmLister); ok {
			load.Durable.Algorithms = al.Algorithms()
		}
	}
	if pb, ok := store.(service.PenaltyBoxer); ok && !pb.PenaltyBoxes() {
		load.NoPenalty, load.Backend = true, backend
	}
	return load
}

// Watch loads the config and hands it to apply, then every change of it,
// until ctx is done: the files' watcher (policy.Watch) or the xDS stream
// (xds.Run). It returns their error; ctx's when it is done.
func (s Source) Watch(ctx context.Context, apply Apply, fail Fail) error {
	if s.XDS != nil {
		return xds.Run(ctx, *s.XDS, apply, fail)
	}
	return policy.Watch(ctx, s.Load, s.Paths, apply, fail)
}

// ReloadOnHUP loads the files at each signal on hup (a file given directly
// whose directory is not watchable, or a change the watcher cannot see,
// e.g. on some network file systems) until ctx is done. With xDS there is
// nothing to reload: the management server pushes every change.
func (s Source) ReloadOnHUP(ctx context.Context, hup <-chan os.Signal, apply Apply, fail Fail) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-hup:
			if s.XDS != nil {
				s.Log.Info("SIGHUP: the config comes from xDS (--config-source=xds) and is pushed by the management server; nothing to reload")
				continue
			}
			s.Log.Info("SIGHUP: reloading config", "config", s.Paths)
			set, warns, err := policy.Load(s.Load, s.Paths...)
			if err != nil {
				fail(err)
			} else {
				apply(set, warns)
			}
		}
	}
}
