package main

import (
	"fmt"

	"github.com/ratelimitd/ratelimitd/internal/configsource"
	"github.com/ratelimitd/ratelimitd/internal/serveopts"
	"github.com/ratelimitd/ratelimitd/pkg/policy"
	"github.com/ratelimitd/ratelimitd/pkg/service"
)

// newConfigSource prepares the config loads: the load options of the
// flags, restricted to what the stores decide, and with
// --config-source=xds the xDS client's options (TLS files read here, so a
// bad one fails startup).
func (s *server) newConfigSource() error {
	o := s.opts
	load := policy.LoadOptions{
		MergeDomains:   o.MergeDomains,
		IgnoreDotFiles: o.IgnoreDotfiles,
		// Reference mode loads a file as often as the config paths
		// name it, as envoyproxy/ratelimit does.
		RepeatPaths: o.Reference,
		// and compares descriptor values as strings (no CIDR prefixes).
		LiteralValues: o.Reference,
		Keys:          policy.KeyOptions{Prefix: o.KeyPrefix, ClearText: o.KeyValues == "clear"},
		MaxRules:      o.MaxConfigRules,
		MaxBytes:      o.MaxConfigBytes,
	}
	s.source = configsource.Source{Load: configsource.Capable(load, o.Backend, s.store, s.durable), Paths: o.Config, Log: s.log}
	if o.ConfigSource == "xds" {
		xo, err := serveopts.XDSOptions(o, s.log, s.source.Load)
		if err != nil {
			return err
		}
		s.source.XDS = &xo
	}
	return nil
}

// startConfigSource starts the first load and hot reload (the files'
// watcher or the xDS stream) and the SIGHUP reloads, until s.watchCtx is
// done. A source that fails for good sends its error to s.fatal.
func (s *server) startConfigSource() {
	s.wg.Add(2)
	go func() {
		defer s.wg.Done()
		// Both sources hand every load to the same swap (s.apply) or
		// rejection (s.fail): the same metrics and log lines.
		if err := s.source.Watch(s.watchCtx, s.apply, s.fail); err != nil && s.watchCtx.Err() == nil {
			s.fatal <- fmt.Errorf("config watch: %w", err)
		}
	}()
	go func() {
		defer s.wg.Done()
		s.source.ReloadOnHUP(s.watchCtx, s.hup, s.apply, s.fail)
	}()
}

// apply installs a freshly loaded config. It runs on the watcher's and on
// the SIGHUP goroutine, one at a time. A load whose content is the
// config in force's (same SourceHash) is a no-op: the policy and the
// store's over-limit cache stay,
// it counts as result="unchanged" and logs at debug only.
func (s *server) apply(set *policy.Set, warnings []policy.Warning) {
	s.reloadMu.Lock()
	defer s.reloadMu.Unlock()
	if cur := s.svc.Policy(); cur != nil && cur.SourceHash() == set.SourceHash() {
		s.svc.CountReload(service.ReloadUnchanged, nil)
		s.log.Debug("config unchanged; nothing applied", "hash", set.Hash())
		return
	}
	for _, w := range warnings {
		if w.File == "" {
			// About the load as a whole, e.g. "no rate-limit domains
			// loaded from …: every request is answered OK without
			// limits": the message is the log line.
			s.log.Warn(w.Message)
			continue
		}
		s.log.Warn("config warning", "warning", w.String())
	}
	s.svc.SetPolicy(set)
	if s.rlqs != nil {
		s.rlqs.SetPolicy(set)
	}
	if r, ok := s.store.(resetter); ok {
		r.ResetCache()
	}
	s.svc.CountReload(service.ReloadSuccess, set)
	first := !s.loaded.Swap(true)
	s.updateHealth()
	s.log.Info("config loaded", "domains", len(set.Domains()), "rules", len(set.Rules()), "hash", set.Hash(), "source_hash", set.SourceHash(), "first", first)
}

// fail records a load that put nothing in force; the last good config, if
// any, stays. A watcher error (policy.WatchError) and a read error
// (policy.IsReadError) are counted apart from a rejected config.
func (s *server) fail(err error) {
	s.reloadMu.Lock()
	defer s.reloadMu.Unlock()
	loaded := s.loaded.Load()
	switch {
	case policy.IsWatchError(err):
		s.svc.CountReload(service.ReloadWatchError, nil)
		s.log.Warn("config watcher error; the config in force is unchanged, reloading", "err", err.Error())
		return
	case policy.IsReadError(err):
		s.svc.CountReload(service.ReloadReadError, nil)
		if loaded {
			s.log.Warn("config files could not be read; keeping the config in force", "err", err.Error())
			return
		}
		s.log.Error("config files could not be read; no config loaded yet: not serving (health NOT_SERVING, requests fail with "+s.noConfigCode()+") until a good config loads", "err", err.Error())
		return
	}
	s.svc.CountReload(service.ReloadFailure, nil)
	if loaded {
		s.log.Error("config rejected; keeping the last good config", "err", err.Error())
		return
	}
	s.log.Error("config rejected; no config loaded yet: not serving (health NOT_SERVING, requests fail with "+s.noConfigCode()+") until a good config loads", "err", err.Error())
}

// noConfigCode is the gRPC code of a call made before the first config
// is in force: the reference's Unknown in reference mode, else
// Unavailable.
func (s *server) noConfigCode() string {
	if s.opts.ReferenceAnswers {
		return "Unknown"
	}
	return "Unavailable"
}
