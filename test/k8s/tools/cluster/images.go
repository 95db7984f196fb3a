package main

import (
	"archive/tar"
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"runtime"
	"sort"
	"strings"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
)

// entry is one file, directory or symlink of an image layer.
type entry struct {
	path     string // absolute path in the image
	mode     int64
	uid, gid int
	dir      bool
	src      string // host file to copy, or
	data     []byte // its content
	link     string // symlink target
}

// image is one image to pack and import.
type image struct {
	ref     string
	entries []entry
	config  v1.Config
}

// images packs and imports every image the overlays name, from the
// current checkout, plus the pause image (and KEDA's with withKEDA).
func images(ctx context.Context, e env, withKEDA bool) error {
	dir := e.path("images")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	refs, err := overlayImages(ctx, e)
	if err != nil {
		return err
	}
	var imgs []image
	imgs = append(imgs, pauseImg(e))
	for _, ref := range refs {
		switch {
		case strings.Contains(ref, "puzzleq"):
			img, err := puzzleqImg(ctx, e, ref)
			if err != nil {
				return err
			}
			imgs = append(imgs, img)
		case strings.HasPrefix(ref, "redis:"):
			img, err := redisImg(ref)
			if err != nil {
				return err
			}
			imgs = append(imgs, img)
		default:
			return fmt.Errorf("the overlays name image %q and the test cluster has no recipe for it", ref)
		}
	}
	if withKEDA {
		imgs = append(imgs, kedaImgs(e)...)
	}
	return importImages(ctx, e, imgs)
}

// importImages packs each image into a tarball and imports it into the
// cluster's containerd, checking that containerd then lists it.
func importImages(ctx context.Context, e env, imgs []image) error {
	dir := e.path("images")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	for _, img := range imgs {
		file := filepath.Join(dir, strings.NewReplacer("/", "_", ":", "_").Replace(img.ref)+".tar")
		if err := writeImage(img, file); err != nil {
			return fmt.Errorf("image %s: %w", img.ref, err)
		}
		if _, err := ctr(ctx, e, "images", "import", "--no-unpack=false", file); err != nil {
			return err
		}
		want := normaliseRef(img.ref)
		if _, err := ctr(ctx, e, "images", "check", "name=="+want); err != nil {
			return err
		}
		out, err := ctr(ctx, e, "images", "ls", "-q", "name=="+want)
		if err != nil {
			return err
		}
		if strings.TrimSpace(out) != want {
			return fmt.Errorf("imported %s but containerd lists %q", file, out)
		}
		fmt.Printf("cluster: image %s imported\n", want)
	}
	return nil
}

// normaliseRef is a reference as containerd and the kubelet spell it
// (docker.io/library/redis:7.4-alpine for redis:7.4-alpine).
func normaliseRef(ref string) string {
	first, _, found := strings.Cut(ref, "/")
	if !found {
		return "docker.io/library/" + ref
	}
	if !strings.ContainsAny(first, ".:") && first != "localhost" {
		return "docker.io/" + ref
	}
	return ref
}

var imageLine = regexp.MustCompile(`(?m)^\s*-?\s*image:\s*"?([^"\s]+)"?\s*$`)

// overlayImages renders every overlay and lists the images they name.
func overlayImages(ctx context.Context, e env) ([]string, error) {
	set := map[string]bool{}
	overlays, err := overlayNames(e)
	if err != nil {
		return nil, err
	}
	for _, o := range overlays {
		out, err := output(ctx, e.repo, e.bin("kubectl"), "kustomize", filepath.Join("deploy", "k8s", "overlays", o))
		if err != nil {
			return nil, err
		}
		for _, m := range imageLine.FindAllStringSubmatch(out, -1) {
			set[m[1]] = true
		}
	}
	var refs []string
	for r := range set {
		refs = append(refs, r)
	}
	sort.Strings(refs)
	return refs, nil
}

func overlayNames(e env) ([]string, error) {
	ents, err := os.ReadDir(filepath.Join(e.repo, "deploy", "k8s", "overlays"))
	if err != nil {
		return nil, err
	}
	var names []string
	for _, d := range ents {
		if d.IsDir() {
			names = append(names, d.Name())
		}
	}
	return names, nil
}

func pauseImg(e env) image {
	return image{
		ref:     pauseImage,
		entries: []entry{{path: "/pause", mode: 0o755, src: e.bin("pause")}},
		config:  v1.Config{Entrypoint: []string{"/pause"}, User: "65535:65535"},
	}
}

// dockerfile is what the final stage of the Dockerfile says about the
// image, so that the test image cannot drift from the real one.
type dockerfile struct {
	user    string
	cmd     []string
	expose  []string
	binDest string // where COPY --from=build /out/ puts the binaries
}

func parseDockerfile(file string) (dockerfile, error) {
	f, err := os.Open(file)
	if err != nil {
		return dockerfile{}, err
	}
	defer f.Close()
	var d dockerfile
	sc := bufio.NewScanner(f)
	final := false
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		word, rest, _ := strings.Cut(line, " ")
		switch strings.ToUpper(word) {
		case "FROM":
			// Only the last stage is the image.
			final = !strings.Contains(strings.ToUpper(rest), " AS ")
			d = dockerfile{}
		case "USER":
			d.user = strings.TrimSpace(rest)
		case "CMD":
			if err := json.Unmarshal([]byte(rest), &d.cmd); err != nil {
				return d, fmt.Errorf("%s: CMD is not in exec form: %w", file, err)
			}
		case "EXPOSE":
			d.expose = strings.Fields(rest)
		case "COPY":
			f := strings.Fields(rest)
			if len(f) == 3 && f[0] == "--from=build" && f[1] == "/out/" {
				d.binDest = f[2]
			}
		}
	}
	if !final || d.user == "" || len(d.cmd) == 0 || d.binDest == "" {
		return d, fmt.Errorf("%s: final stage lacks USER, CMD or COPY --from=build /out/ DEST (%+v)", file, d)
	}
	return d, sc.Err()
}

// puzzleqImg builds the binaries with scripts/build.sh (the Dockerfile's
// own build line) and lays them out as the Dockerfile's final stage does
// on distroless/static:nonroot: same user, command, ports and paths, and
// the files of distroless the binaries can meet (passwd, group, /tmp,
// the nonroot home).
func puzzleqImg(ctx context.Context, e env, ref string) (image, error) {
	d, err := parseDockerfile(filepath.Join(e.repo, "Dockerfile"))
	if err != nil {
		return image{}, err
	}
	out := e.path("images", "puzzleq-bin")
	if err := os.RemoveAll(out); err != nil {
		return image{}, err
	}
	if err := runEnv(ctx, e.repo, []string{"GOTOOLCHAIN=local"}, "sh", "scripts/build.sh", out); err != nil {
		return image{}, err
	}
	bins, err := os.ReadDir(out)
	if err != nil {
		return image{}, err
	}
	ents := distrolessBase()
	for _, b := range bins {
		ents = append(ents, entry{path: path.Join(d.binDest, b.Name()), mode: 0o755, src: filepath.Join(out, b.Name())})
	}
	ports := map[string]struct{}{}
	for _, p := range d.expose {
		if !strings.Contains(p, "/") {
			p += "/tcp"
		}
		ports[p] = struct{}{}
	}
	return image{ref: ref, entries: ents, config: v1.Config{
		User:         d.user,
		Cmd:          d.cmd,
		ExposedPorts: ports,
		Env:          []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"},
		WorkingDir:   "/home/nonroot",
	}}, nil
}

func distrolessBase() []entry {
	return []entry{
		{path: "/etc", dir: true, mode: 0o755},
		{path: "/etc/passwd", mode: 0o644, data: []byte("root:x:0:0:root:/root:/sbin/nologin\nnobody:x:65534:65534:nobody:/nonexistent:/sbin/nologin\nnonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin\n")},
		{path: "/etc/group", mode: 0o644, data: []byte("root:x:0:\nnobody:x:65534:\nnonroot:x:65532:\n")},
		{path: "/tmp", dir: true, mode: 0o1777},
		{path: "/home", dir: true, mode: 0o755},
		{path: "/home/nonroot", dir: true, mode: 0o700, uid: 65532, gid: 65532},
		{path: "/usr", dir: true, mode: 0o755},
		{path: "/usr/local", dir: true, mode: 0o755},
		{path: "/usr/local/bin", dir: true, mode: 0o755},
	}
}

// redisImg packs Debian's redis-server and redis-cli with the shared
// libraries they load, on the paths the StatefulSet uses (PATH lookup of
// redis-server and redis-cli).
func redisImg(ref string) (image, error) {
	ents := []entry{{path: "/tmp", dir: true, mode: 0o1777}, {path: "/data", dir: true, mode: 0o755, uid: 999, gid: 999}}
	seen := map[string]bool{}
	for _, bin := range []string{"/usr/bin/redis-server", "/usr/bin/redis-cli"} {
		real, err := filepath.EvalSymlinks(bin)
		if err != nil {
			return image{}, fmt.Errorf("%s (install redis-server): %w", bin, err)
		}
		ents = append(ents, entry{path: bin, mode: 0o755, src: real})
		libs, err := sharedLibs(real)
		if err != nil {
			return image{}, err
		}
		for _, l := range libs {
			if seen[l] {
				continue
			}
			seen[l] = true
			real, err := filepath.EvalSymlinks(l)
			if err != nil {
				return image{}, err
			}
			ents = append(ents, entry{path: l, mode: 0o755, src: real})
		}
	}
	return image{ref: ref, entries: ents, config: v1.Config{
		Cmd: []string{"redis-server"},
		Env: []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"},
	}}, nil
}

var lddLine = regexp.MustCompile(`(/\S+)\s+\(0x`)

func sharedLibs(bin string) ([]string, error) {
	out, err := output(context.Background(), "", "ldd", bin)
	if err != nil {
		return nil, err
	}
	var libs []string
	for _, m := range lddLine.FindAllStringSubmatch(out, -1) {
		libs = append(libs, m[1])
	}
	return libs, nil
}

func writeImage(img image, file string) error {
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	dirs := map[string]bool{"/": true}
	var addParents func(p string) error
	addParents = func(p string) error {
		parent := path.Dir(p)
		if dirs[parent] {
			return nil
		}
		if err := addParents(parent); err != nil {
			return err
		}
		dirs[parent] = true
		return tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: strings.TrimPrefix(parent, "/") + "/", Mode: 0o755})
	}
	for _, en := range img.entries {
		if err := addParents(en.path); err != nil {
			return err
		}
		name := strings.TrimPrefix(en.path, "/")
		hdr := &tar.Header{Name: name, Mode: en.mode, Uid: en.uid, Gid: en.gid}
		switch {
		case en.dir:
			if dirs[en.path] {
				continue
			}
			dirs[en.path] = true
			hdr.Typeflag, hdr.Name = tar.TypeDir, name+"/"
			if err := tw.WriteHeader(hdr); err != nil {
				return err
			}
		case en.link != "":
			hdr.Typeflag, hdr.Linkname = tar.TypeSymlink, en.link
			if err := tw.WriteHeader(hdr); err != nil {
				return err
			}
		default:
			data := en.data
			if en.src != "" {
				b, err := os.ReadFile(en.src)
				if err != nil {
					return err
				}
				data = b
			}
			hdr.Typeflag, hdr.Size = tar.TypeReg, int64(len(data))
			if err := tw.WriteHeader(hdr); err != nil {
				return err
			}
			if _, err := tw.Write(data); err != nil {
				return err
			}
		}
	}
	if err := tw.Close(); err != nil {
		return err
	}
	layerBytes := buf.Bytes()
	layer, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) {
		return io.NopCloser(bytes.NewReader(layerBytes)), nil
	})
	if err != nil {
		return err
	}
	im, err := mutate.AppendLayers(empty.Image, layer)
	if err != nil {
		return err
	}
	cf, err := im.ConfigFile()
	if err != nil {
		return err
	}
	cf = cf.DeepCopy()
	cf.OS, cf.Architecture = "linux", runtime.GOARCH
	cf.Config = img.config
	im, err = mutate.ConfigFile(im, cf)
	if err != nil {
		return err
	}
	tag, err := name.NewTag(img.ref)
	if err != nil {
		return err
	}
	return tarball.WriteToFile(file, tag, im)
}
