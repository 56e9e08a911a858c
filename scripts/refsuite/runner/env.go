package runner

import (
	"fmt"
	"reflect"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/envoyproxy/ratelimit/src/settings"
)

// settingsEnv renders s as the reference's environment: one NAME=value per
// field of settings.Settings that has an `envconfig` tag, in the syntax
// kelseyhightower/envconfig parses (durations as time.Duration.String, maps
// as k:v,k2:v2, slices comma-joined). A field whose value is the zero value
// and whose `default` tag is empty is left out (unset and empty mean the same
// to envconfig); every other field is rendered, defaults included. Fields
// without a tag (the *tls.Config values, the gRPC interceptor) are built by
// the reference from the tagged ones and have no variable.
func settingsEnv(s settings.Settings) ([]string, error) {
	v := reflect.ValueOf(s)
	t := v.Type()
	var env []string
	for i := 0; i < t.NumField(); i++ {
		f := t.Field(i)
		name := f.Tag.Get("envconfig")
		if name == "" || !f.IsExported() {
			continue
		}
		fv := v.Field(i)
		if fv.IsZero() && f.Tag.Get("default") == "" {
			continue
		}
		val, err := formatValue(fv)
		if err != nil {
			return nil, fmt.Errorf("settings field %s (%s): %w", f.Name, name, err)
		}
		env = append(env, name+"="+val)
	}
	return env, nil
}

var durationType = reflect.TypeOf(time.Duration(0))

func formatValue(v reflect.Value) (string, error) {
	if v.Type() == durationType {
		return time.Duration(v.Int()).String(), nil
	}
	switch v.Kind() {
	case reflect.String:
		return v.String(), nil
	case reflect.Bool:
		return strconv.FormatBool(v.Bool()), nil
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		return strconv.FormatInt(v.Int(), 10), nil
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		return strconv.FormatUint(v.Uint(), 10), nil
	case reflect.Float32:
		return strconv.FormatFloat(v.Float(), 'g', -1, 32), nil
	case reflect.Float64:
		return strconv.FormatFloat(v.Float(), 'g', -1, 64), nil
	case reflect.Slice:
		parts := make([]string, v.Len())
		for i := range parts {
			p, err := formatValue(v.Index(i))
			if err != nil {
				return "", err
			}
			parts[i] = p
		}
		return strings.Join(parts, ","), nil
	case reflect.Map:
		var parts []string
		iter := v.MapRange()
		for iter.Next() {
			k, err := formatValue(iter.Key())
			if err != nil {
				return "", err
			}
			val, err := formatValue(iter.Value())
			if err != nil {
				return "", err
			}
			parts = append(parts, k+":"+val)
		}
		sort.Strings(parts)
		return strings.Join(parts, ","), nil
	}
	return "", fmt.Errorf("unsupported kind %s", v.Kind())
}

// referenceNames are the variable names of every tagged settings field, to
// keep the test process's own values of them (the suite sets USE_STATSD in
// init) out of the child's environment.
func referenceNames() map[string]bool {
	t := reflect.TypeOf(settings.Settings{})
	names := map[string]bool{}
	for i := 0; i < t.NumField(); i++ {
		if n := t.Field(i).Tag.Get("envconfig"); n != "" {
			names[n] = true
		}
	}
	return names
}
