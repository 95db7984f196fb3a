package cli

// The config file holds named contexts (a server and an API key), as
// kubectl's kubeconfig does, so that someone who works with several
// deployments switches with one word instead of two environment variables.

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"text/tabwriter"

	"github.com/spf13/cobra"
	"sigs.k8s.io/yaml"
)

// configEnv names the config file, overriding the default path.
const configEnv = "PUZZLECTL_CONFIG"

// maxConfigBytes bounds the config file read: a file this large is not one
// puzzlectl wrote.
const maxConfigBytes = 1 << 20

// configFile is the config file's content.
type configFile struct {
	CurrentContext string          `json:"current-context,omitempty"`
	Contexts       []configContext `json:"contexts,omitempty"`
}

// configContext is one named server and API key.
type configContext struct {
	Name   string `json:"name"`
	Server string `json:"server,omitempty"`
	APIKey string `json:"api-key,omitempty"`
}

func (f *configFile) find(name string) *configContext {
	for i := range f.Contexts {
		if f.Contexts[i].Name == name {
			return &f.Contexts[i]
		}
	}
	return nil
}

// configPath is $PUZZLECTL_CONFIG, else config.yaml in puzzlectl's
// directory of the user's config directory (~/.config/puzzlectl on Linux).
func configPath() (string, error) {
	if p := os.Getenv(configEnv); p != "" {
		return p, nil
	}
	dir, err := os.UserConfigDir()
	if err != nil {
		return "", usagef("no config directory (%v): set %s to the config file's path", err, configEnv)
	}
	return filepath.Join(dir, "puzzlectl", "config.yaml"), nil
}

// loadConfig reads the config file; a missing file is an empty config,
// and so is a missing config directory unless required (a --context was
// named): puzzlectl run by cron or in a container without $HOME works
// from its flags and environment alone. Fields it does not know are
// ignored, so a file written by a newer puzzlectl still reads.
func loadConfig(required bool) (*configFile, string, error) {
	path, err := configPath()
	if err != nil {
		if !required {
			return &configFile{}, "", nil
		}
		return nil, "", err
	}
	// Only a regular file is read: opening a FIFO (or a link to one)
	// would block for good, and no signal would end the wait.
	fi, err := os.Stat(path)
	if errors.Is(err, fs.ErrNotExist) {
		return &configFile{}, path, nil
	}
	if err == nil && !fi.Mode().IsRegular() {
		return nil, path, usagef("config file %s: not a regular file (%s)", path, fi.Mode().Type())
	}
	f, err := os.Open(path)
	if err != nil {
		return nil, path, usagef("config file: %v", err)
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, maxConfigBytes+1))
	if err != nil {
		return nil, path, usagef("config file: %v", err)
	}
	if len(b) > maxConfigBytes {
		return nil, path, usagef("config file %s: larger than %d bytes", path, maxConfigBytes)
	}
	var c configFile
	if err := yaml.Unmarshal(b, &c); err != nil {
		return nil, path, usagef("config file %s: %v", path, err)
	}
	return &c, path, nil
}

// save writes c to path atomically and readable by its owner only, since
// it holds API keys. When path is a symbolic link (dotfile managers link
// the file from a repository), the file it names is replaced, not the
// link.
func (c *configFile) save(path string) error {
	b, err := yaml.Marshal(c)
	if err != nil {
		return err
	}
	path = linkTarget(path)
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return err
	}
	// CreateTemp makes the file 0600.
	f, err := os.CreateTemp(filepath.Dir(path), ".config-*.yaml")
	if err != nil {
		return err
	}
	_, err = f.Write(b)
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(f.Name(), path)
	}
	if err != nil {
		os.Remove(f.Name())
	}
	return err
}

// linkTarget is the file path's symbolic links name, followed to the end,
// whether or not it exists yet; path itself when it is not a link.
func linkTarget(path string) string {
	for range 40 { // as many links as Linux follows
		fi, err := os.Lstat(path)
		if err != nil || fi.Mode().Type() != fs.ModeSymlink {
			return path
		}
		dest, err := os.Readlink(path)
		if err != nil {
			return path
		}
		if !filepath.IsAbs(dest) {
			dest = filepath.Join(filepath.Dir(path), dest)
		}
		path = dest
	}
	return path
}

// resolve fills the server and API key. The server comes from, in
// order: --server; the context --context names; $PUZZLEQ_URL; the config
// file's current context; the default. The key comes from --api-key, else
// from the same places, but a context's key only goes to that context's
// server: a key is never sent to a server it was not stored with. The
// config file is read only when a flag or variable leaves something to
// fill.
func (g *globals) resolve() error {
	if g.resolved {
		return nil
	}
	serverSet := g.flags != nil && g.flags.Changed("server")
	keySet := g.flags != nil && g.flags.Changed("api-key")
	envServer, envKey := os.Getenv("PUZZLEQ_URL"), os.Getenv("PUZZLEQ_API_KEY")
	var named, current *configContext
	if g.context != "" || (!serverSet && envServer == "") || (!keySet && envKey == "") {
		c, path, err := loadConfig(g.context != "")
		if err != nil {
			return err
		}
		if g.context != "" {
			if named = c.find(g.context); named == nil {
				return usagef("context %q is not in %s; puzzlectl config get-contexts lists them", g.context, path)
			}
		} else if c.CurrentContext != "" {
			current = c.find(c.CurrentContext) // a current context since deleted is none
		}
	}
	if !serverSet {
		g.server = firstSet(contextServer(named), envServer, contextServer(current), defaultServer)
	}
	if !keySet {
		g.apiKey = firstSet(contextKey(named, g.server), envKey, contextKey(current, g.server))
	}
	g.resolved = true
	return nil
}

// contextServer is c's server; "" without a context or a server.
func contextServer(c *configContext) string {
	if c == nil {
		return ""
	}
	return c.Server
}

// contextKey is c's key when server is c's server (the default server for
// a context without one), else "".
func contextKey(c *configContext, server string) string {
	if c == nil || strings.TrimSuffix(firstSet(c.Server, defaultServer), "/") != strings.TrimSuffix(server, "/") {
		return ""
	}
	return c.APIKey
}

// firstSet is the first of vs that is not empty.
func firstSet(vs ...string) string {
	for _, v := range vs {
		if v != "" {
			return v
		}
	}
	return ""
}

func newConfigCmd(g *globals) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "config",
		Short: "Manage contexts: named servers and API keys",
		Long: `Manage the contexts of the config file ($PUZZLECTL_CONFIG, else
~/.config/puzzlectl/config.yaml on Linux; written readable by its owner
only, since it holds API keys). A context names a server and an API key;
--context NAME picks one for a command, and use-context sets the one used
by default.

The server and key come from, in order: --server and --api-key; the
context --context names; $PUZZLEQ_URL and $PUZZLEQ_API_KEY; the current
context; http://localhost:8080. A context's key is only sent to that
context's server.`,
		Example: `  puzzlectl config set-context prod --server https://puzzleq.example.com --api-key "$KEY"
  puzzlectl config use-context prod
  puzzlectl config get-contexts
  puzzlectl --context staging list`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return usagef("%s needs a subcommand; see %s --help", cmd.CommandPath(), cmd.CommandPath())
		},
	}
	cmd.AddCommand(&cobra.Command{
		Use:   "set-context NAME [--server URL] [--api-key KEY]",
		Short: "Create or change a context",
		Long: `Create the context NAME, or change it: --server and --api-key set its
server and key (a flag not given leaves that part as it was). The first
context created becomes the current one.`,
		Args: exactArgs(1, "a context name"),
		RunE: func(cmd *cobra.Command, args []string) error {
			return editConfig(cmd, func(c *configFile, path string) (string, error) {
				name := args[0]
				if name == "" {
					return "", usagef("a context's name must not be empty")
				}
				ctx := c.find(name)
				if ctx == nil {
					c.Contexts = append(c.Contexts, configContext{Name: name})
					ctx = &c.Contexts[len(c.Contexts)-1]
				}
				if g.flags.Changed("server") {
					if err := checkServer(g.server); err != nil {
						return "", err
					}
					ctx.Server = g.server
				}
				if g.flags.Changed("api-key") {
					ctx.APIKey = g.apiKey
				}
				if c.CurrentContext == "" {
					c.CurrentContext = name
				}
				return fmt.Sprintf("context %q set in %s", name, path), nil
			})
		},
	}, &cobra.Command{
		Use:               "use-context NAME",
		Short:             "Make a context the one used by default",
		Args:              exactArgs(1, "a context name"),
		ValidArgsFunction: completeContexts,
		RunE: func(cmd *cobra.Command, args []string) error {
			return editConfig(cmd, func(c *configFile, path string) (string, error) {
				if c.find(args[0]) == nil {
					return "", usagef("context %q is not in %s; puzzlectl config get-contexts lists them", args[0], path)
				}
				c.CurrentContext = args[0]
				return fmt.Sprintf("using context %q", args[0]), nil
			})
		},
	}, &cobra.Command{
		Use:               "delete-context NAME",
		Short:             "Delete a context",
		Args:              exactArgs(1, "a context name"),
		ValidArgsFunction: completeContexts,
		RunE: func(cmd *cobra.Command, args []string) error {
			return editConfig(cmd, func(c *configFile, path string) (string, error) {
				i := slices.IndexFunc(c.Contexts, func(x configContext) bool { return x.Name == args[0] })
				if i < 0 {
					return "", usagef("context %q is not in %s", args[0], path)
				}
				c.Contexts = slices.Delete(c.Contexts, i, i+1)
				if c.CurrentContext == args[0] {
					c.CurrentContext = ""
				}
				return fmt.Sprintf("deleted context %q", args[0]), nil
			})
		},
	}, &cobra.Command{
		Use:   "current-context",
		Short: "Print the current context's name",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, path, err := loadConfig(true)
			if err != nil {
				return err
			}
			if c.CurrentContext == "" {
				return usagef("no current context in %s; puzzlectl config use-context NAME sets one", path)
			}
			_, err = fmt.Fprintln(cmd.OutOrStdout(), c.CurrentContext)
			return err
		},
	}, &cobra.Command{
		Use:   "get-contexts",
		Short: "List the contexts (never their keys)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			format, err := g.outputFormat(formatTable)
			if err != nil {
				return err
			}
			c, _, err := loadConfig(true)
			if err != nil {
				return err
			}
			out := cmd.OutOrStdout()
			if format != formatTable {
				lw := newListWriter(out, format)
				for _, x := range c.Contexts {
					if err := lw.add(contextDoc{x.Name, x.Server, x.APIKey != "", x.Name == c.CurrentContext}); err != nil {
						return err
					}
				}
				return lw.close()
			}
			tw := tabwriter.NewWriter(out, 0, 8, 2, ' ', 0)
			fmt.Fprintln(tw, "CURRENT\tNAME\tSERVER\tAPI KEY")
			for _, x := range c.Contexts {
				cur, key, server := "", "-", x.Server
				if x.Name == c.CurrentContext {
					cur = "*"
				}
				if x.APIKey != "" {
					key = "set"
				}
				if server == "" {
					server = "-"
				}
				fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", cur, x.Name, server, key)
			}
			return tw.Flush()
		},
	})
	return cmd
}

// editConfig loads the config file, lets edit change it, saves it and
// prints edit's message; an error from edit leaves the file as it was.
func editConfig(cmd *cobra.Command, edit func(c *configFile, path string) (string, error)) error {
	c, path, err := loadConfig(true)
	if err != nil {
		return err
	}
	msg, err := edit(c, path)
	if err != nil {
		return err
	}
	if err := c.save(path); err != nil {
		return usagef("config file %s: %v", path, err)
	}
	_, err = fmt.Fprintln(cmd.OutOrStdout(), msg)
	return err
}

// contextDoc is a context as get-contexts prints it: whether it has a key,
// never the key.
type contextDoc struct {
	Name    string `json:"name"`
	Server  string `json:"server,omitempty"`
	HasKey  bool   `json:"api_key_set"`
	Current bool   `json:"current"`
}

func completeContexts(_ *cobra.Command, args []string, _ string) ([]cobra.Completion, cobra.ShellCompDirective) {
	if len(args) > 0 {
		return nil, cobra.ShellCompDirectiveNoFileComp
	}
	c, _, err := loadConfig(true)
	if err != nil {
		return nil, cobra.ShellCompDirectiveNoFileComp
	}
	var names []cobra.Completion
	for _, x := range c.Contexts {
		names = append(names, cobra.CompletionWithDesc(x.Name, x.Server))
	}
	return names, cobra.ShellCompDirectiveNoFileComp
}
