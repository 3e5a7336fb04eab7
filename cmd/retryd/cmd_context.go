package main

import (
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"text/tabwriter"

	"github.com/spf13/cobra"
)

// Environment of the saved contexts.
const (
	envContext = "RETRYD_CONTEXT"
	envConfig  = "RETRYD_CONFIG"
)

// cliContext is a saved API: where it is and the token to send it, as the
// nats CLI and kubectl save theirs, so an operator switches between
// deployments by name rather than by exporting a token each time.
type cliContext struct {
	API    string `json:"api"`
	Token  string `json:"token,omitempty"`
	CAFile string `json:"ca_file,omitempty"`
}

// contextFile is the file of saved contexts (--config): readable by its
// owner only, since it holds tokens.
type contextFile struct {
	Current  string                `json:"current,omitempty"`
	Contexts map[string]cliContext `json:"contexts"`
}

// defaultConfigPath is contexts.json in the user's config directory
// ($XDG_CONFIG_HOME/retryd, ~/.config/retryd on Linux); empty when the
// system has none.
func defaultConfigPath() string {
	dir, err := os.UserConfigDir()
	if err != nil {
		return ""
	}
	return filepath.Join(dir, "retryd", "contexts.json")
}

func loadContexts(path string) (contextFile, error) {
	f := contextFile{Contexts: map[string]cliContext{}}
	if path == "" {
		return f, nil
	}
	raw, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return f, nil
	}
	if err != nil {
		return f, fmt.Errorf("read contexts: %w", err)
	}
	if err := json.Unmarshal(raw, &f); err != nil {
		return f, fmt.Errorf("read contexts %s: %w", path, err)
	}
	if f.Contexts == nil {
		f.Contexts = map[string]cliContext{}
	}
	return f, nil
}

// save writes the file whole (a temporary file renamed over it), mode
// 0600 in a 0700 directory.
func (f contextFile) save(path string) error {
	if path == "" {
		return errors.New("save contexts: no config directory: pass --config")
	}
	raw, err := json.MarshalIndent(f, "", "  ")
	if err != nil {
		return fmt.Errorf("save contexts: %w", err)
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return fmt.Errorf("save contexts: %w", err)
	}
	tmp, err := os.CreateTemp(filepath.Dir(path), ".contexts-*")
	if err != nil {
		return fmt.Errorf("save contexts: %w", err)
	}
	defer os.Remove(tmp.Name()) //nolint:errcheck // gone after the rename
	if _, err := tmp.Write(append(raw, '\n')); err != nil {
		tmp.Close() //nolint:errcheck,gosec // the write error is the one to report
		return fmt.Errorf("save contexts: %w", err)
	}
	if err := tmp.Chmod(0o600); err != nil {
		tmp.Close() //nolint:errcheck,gosec // the chmod error is the one to report
		return fmt.Errorf("save contexts: %w", err)
	}
	if err := tmp.Close(); err != nil {
		return fmt.Errorf("save contexts: %w", err)
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		return fmt.Errorf("save contexts: %w", err)
	}
	return nil
}

// applyContext fills in, from the chosen context (--context, else
// RETRYD_CONTEXT, else the file's current one), what neither a flag nor
// the environment set: flags and environment win, so one command can
// still aim elsewhere.
func (g *globals) applyContext(cmd *cobra.Command) error {
	name := g.context
	if name == "" {
		name = os.Getenv(envContext)
	}
	f, err := loadContexts(g.config)
	if err != nil {
		return err
	}
	if name == "" {
		name = f.Current
	}
	if name == "" {
		return nil
	}
	c, ok := f.Contexts[name]
	if !ok {
		return usageErr(fmt.Errorf("no saved context %q in %s (retryd context ls)", name, g.config))
	}
	flags := cmd.Flags()
	if !flags.Changed("api") && os.Getenv(envAPI) == "" && c.API != "" {
		g.api = c.API
	}
	if !flags.Changed("token") && os.Getenv(envToken) == "" {
		g.token = c.Token
	}
	if !flags.Changed("ca-file") && os.Getenv(envCAFile) == "" {
		g.caFile = c.CAFile
	}
	return nil
}

// editContexts loads the saved contexts, lets edit change them and saves
// them. With need set, name must be a saved context.
func editContexts(g *globals, verb, name string, need bool, edit func(f *contextFile)) error {
	f, err := loadContexts(g.config)
	if err != nil {
		return err
	}
	if _, ok := f.Contexts[name]; need && !ok {
		return fmt.Errorf("%s context: no saved context %q (retryd context ls)", verb, name)
	}
	edit(&f)
	return f.save(g.config)
}

func newContextCmd(g *globals) *cobra.Command {
	cmd := group(&cobra.Command{
		Use:   "context",
		Short: "Save APIs and their tokens by name, and choose one",
		Long: `context saves an API's address and token (and CA file) under a name, in
--config (default: contexts.json in the user's config directory, mode 0600),
and chooses the one commands use when --api, --token and --ca-file (and
their environment variables) are not given. --context NAME or
RETRYD_CONTEXT picks one for a single command.`,
	})
	save := &cobra.Command{
		Use:   "save NAME",
		Short: "Save --api, --token and --ca-file under NAME (and use it when none is chosen yet)",
		Args:  args(1, "NAME"),
		RunE: func(_ *cobra.Command, a []string) error {
			err := editContexts(g, "save", a[0], false, func(f *contextFile) {
				f.Contexts[a[0]] = cliContext{API: g.api, Token: g.token, CAFile: g.caFile}
				if f.Current == "" {
					f.Current = a[0]
				}
			})
			if err != nil {
				return err
			}
			fmt.Fprintf(g.stderr, "saved context %s (%s)\n", a[0], g.api)
			return nil
		},
	}
	use := &cobra.Command{
		Use:   "use NAME",
		Short: "Make NAME the context commands use",
		Args:  args(1, "NAME"),
		RunE: func(_ *cobra.Command, a []string) error {
			return editContexts(g, "use", a[0], true, func(f *contextFile) { f.Current = a[0] })
		},
	}
	rm := &cobra.Command{
		Use:   "rm NAME",
		Short: "Forget context NAME (and its token)",
		Args:  args(1, "NAME"),
		RunE: func(_ *cobra.Command, a []string) error {
			return editContexts(g, "remove", a[0], true, func(f *contextFile) {
				delete(f.Contexts, a[0])
				if f.Current == a[0] {
					f.Current = ""
				}
			})
		},
	}
	ls := &cobra.Command{
		Use:   "ls",
		Short: "List saved contexts (never their tokens)",
		Args:  args(0),
		RunE: func(_ *cobra.Command, _ []string) error {
			f, err := loadContexts(g.config)
			if err != nil {
				return err
			}
			names := make([]string, 0, len(f.Contexts))
			for n := range f.Contexts {
				names = append(names, n)
			}
			slices.Sort(names)
			w := tabwriter.NewWriter(g.stdout, 0, 4, 2, ' ', 0)
			fmt.Fprintln(w, "CURRENT\tNAME\tAPI\tTOKEN\tCA FILE")
			for _, n := range names {
				c := f.Contexts[n]
				cur, tok := "", "-"
				if n == f.Current {
					cur = "*"
				}
				if c.Token != "" {
					tok = "saved"
				}
				fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%s\n", cur, n, c.API, tok, cmp.Or(c.CAFile, "-"))
			}
			return w.Flush()
		},
	}
	cmd.AddCommand(save, use, rm, ls)
	return cmd
}
