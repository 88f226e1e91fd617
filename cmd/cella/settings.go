package main

import (
	"errors"
	"fmt"
	"os"
	"strings"

	"github.com/spf13/pflag"

	"github.com/cella-sandbox/cella/internal/daemon"
)

// A setting is one field of a command's configuration, declared once: its
// flag, its CELLA_* variable, its default and its doc, and how a value
// becomes the typed field it sets. The flag wins over the variable, the
// variable over the default. Variables are read when the command runs, not
// when the command tree is made: a bad CELLA_* value of `cella serve` is
// nothing to `cella ls`.
type setting struct {
	flag string // without "--"
	env  string
	// def is the default as an operator writes it ("" is none); it goes
	// through apply like any value, so a default cannot be of another type.
	def  string
	kind string // the value's name in --help ("duration", "size"); "bool" is a switch
	// list settings repeat (each flag value may be a comma-separated list
	// too) and their variable holds a comma-separated list.
	list bool
	// usage is the --help line and the README's description: plain text
	// that is also markdown (no backquotes, which pflag would read as the
	// value's name, no angle brackets, no pipes). more, markdown, follows it
	// in the README only.
	usage, more string
	// apply parses the values (one for a scalar; none or more for a list)
	// and sets the field; its error says what is wrong with the value, and
	// resolve adds where it came from.
	apply func(vals []string) error
}

// one is the apply of a scalar setting: parse into *dst.
func one[T any](dst *T, parse func(string) (T, error)) func([]string) error {
	return func(vals []string) error {
		v, err := parse(vals[len(vals)-1])
		if err != nil {
			return err
		}
		*dst = v
		return nil
	}
}

// all is the apply of a list setting: parse every value into *dst.
func all[T any](dst *T, parse func([]string) (T, error)) func([]string) error {
	return func(vals []string) error {
		v, err := parse(vals)
		if err != nil {
			return err
		}
		*dst = v
		return nil
	}
}

// settings are the settings of one command, registered on its flags.
type settings struct {
	list []*setting
	vals []*settingValue
	// from maps each flag to where its value came from, as resolve named
	// it: "--pool" or "CELLA_POOL".
	from map[string]string
}

// register adds each setting as a flag of fs, in the order given (which
// --help keeps).
func register(fs *pflag.FlagSet, list ...*setting) *settings {
	fs.SortFlags = false
	ss := &settings{list: list, from: map[string]string{}}
	for _, s := range list {
		v := &settingValue{s: s}
		usage := s.usage + " [" + s.env + "]"
		if s.list {
			usage = s.usage + " (repeatable) [" + s.env + ", comma-separated]"
		}
		fs.Var(v, s.flag, usage)
		f := fs.Lookup(s.flag)
		f.DefValue = s.def
		if s.kind == "bool" {
			f.NoOptDefVal = "true"
		}
		ss.vals = append(ss.vals, v)
	}
	return ss
}

// resolve applies every setting from its flag when given, else from its
// variable when set and not empty, else from its default. The first bad
// value is an error that names its flag or variable.
func (ss *settings) resolve() error {
	for _, v := range ss.vals {
		s := v.s
		vals, from := []string{s.def}, "--"+s.flag
		if s.list {
			vals = splitList(s.def)
		}
		switch env := strings.TrimSpace(os.Getenv(s.env)); {
		case v.changed:
			vals = v.vals
		case env != "":
			vals, from = []string{env}, s.env
			if s.list {
				vals = splitList(env)
			}
		}
		ss.from[s.flag] = from
		if err := s.apply(vals); err != nil {
			return fmt.Errorf("%s: %w", from, err)
		}
	}
	return nil
}

// name gives an error of daemon.Config.Validate the flag or variable its
// value came from.
func (ss *settings) name(err error) error {
	var fe *daemon.FieldError
	if errors.As(err, &fe) {
		if from, ok := ss.from[fe.Field]; ok {
			return fmt.Errorf("%s: %w", from, fe.Err)
		}
	}
	return err
}

// splitList is a flag value or variable of a list setting as items.
func splitList(v string) []string {
	var out []string
	for _, item := range strings.Split(v, ",") {
		if item = strings.TrimSpace(item); item != "" {
			out = append(out, item)
		}
	}
	return out
}

// settingValue is a setting's pflag.Value: it keeps what the command line
// said, for resolve to parse (so that flag and variable errors read alike).
type settingValue struct {
	s       *setting
	vals    []string
	changed bool
}

func (v *settingValue) String() string { return strings.Join(v.vals, ",") }
func (v *settingValue) Type() string   { return v.s.kind }

func (v *settingValue) Set(x string) error {
	if v.s.list {
		v.vals = append(v.vals, splitList(x)...)
	} else {
		v.vals = []string{x}
	}
	v.changed = true
	return nil
}

// readmeTable renders settings as the README's table of them.
func readmeTable(list []*setting) string {
	var b strings.Builder
	b.WriteString("| flag | env | default | what it does |\n| --- | --- | --- | --- |\n")
	for _, s := range list {
		flag, env, def := "`--"+s.flag+"`", "`"+s.env+"`", "none"
		if s.list {
			flag += " (repeatable)"
			env += " (comma-separated)"
		}
		if s.def != "" {
			def = "`" + s.def + "`"
		}
		doc := s.usage
		if s.more != "" {
			doc += " " + s.more
		}
		fmt.Fprintf(&b, "| %s | %s | %s | %s |\n", flag, env, def, doc)
	}
	return b.String()
}
