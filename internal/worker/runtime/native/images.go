package native

import (
	"archive/tar"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync"

	securejoin "github.com/cyphar/filepath-securejoin"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"

	"github.com/brisk-faas/brisk/internal/image"
)

// imageStore keeps images unpacked once each as read-only lower layers:
// <dir>/<manifest digest hex>/rootfs and config.json beside it, and
// refs.json mapping references to digests. `brisk image push
// --to-workers` fills it through ImportImage.
type imageStore struct {
	dir string
	mu  sync.Mutex // serialises imports and refs.json
	// cache holds what lookup read from disk, ref → *unpackedImage, so a
	// cold start reads no file; Import drops the refs it rewrites.
	cache sync.Map
}

// imageConfig is what a sandbox needs of an image's configuration.
type imageConfig struct {
	Entrypoint []string `json:"entrypoint,omitempty"`
	Cmd        []string `json:"cmd,omitempty"`
	Env        []string `json:"env,omitempty"`
	WorkingDir string   `json:"working_dir,omitempty"`
	User       string   `json:"user,omitempty"`
}

// unpackedImage is one image ready to be a lower layer.
type unpackedImage struct {
	Rootfs string
	Config imageConfig
}

func newImageStore(dir string) (*imageStore, error) {
	if err := os.MkdirAll(dir, 0o711); err != nil {
		return nil, err
	}
	return &imageStore{dir: dir}, nil
}

func (s *imageStore) refs() (map[string]string, error) {
	b, err := os.ReadFile(filepath.Join(s.dir, "refs.json"))
	if errors.Is(err, os.ErrNotExist) {
		return map[string]string{}, nil
	}
	if err != nil {
		return nil, err
	}
	m := map[string]string{}
	if err := json.Unmarshal(b, &m); err != nil {
		return nil, fmt.Errorf("%s: %w", filepath.Join(s.dir, "refs.json"), err)
	}
	return m, nil
}

// lookup returns the unpacked image ref names.
func (s *imageStore) lookup(ref string) (*unpackedImage, error) {
	if u, ok := s.cache.Load(ref); ok {
		return u.(*unpackedImage), nil
	}
	s.mu.Lock()
	refs, err := s.refs()
	s.mu.Unlock()
	if err != nil {
		return nil, err
	}
	hex, ok := refs[ref]
	if !ok {
		return nil, fmt.Errorf("image %q is not on this worker (the native runtime runs images pushed with `brisk image push --to-workers`)", ref)
	}
	dir := filepath.Join(s.dir, hex)
	b, err := os.ReadFile(filepath.Join(dir, "config.json"))
	if err != nil {
		return nil, fmt.Errorf("image %q: %w", ref, err)
	}
	u := &unpackedImage{Rootfs: filepath.Join(dir, "rootfs")}
	if err := json.Unmarshal(b, &u.Config); err != nil {
		return nil, fmt.Errorf("image %q: %w", ref, err)
	}
	s.cache.Store(ref, u)
	return u, nil
}

// maxLayoutBytes bounds an imported archive once unpacked.
const maxLayoutBytes = 8 << 30

// Import reads an OCI archive (a tar of an image layout, as `brisk image
// build` writes) and unpacks each image it names that is not unpacked yet.
func (s *imageStore) Import(ctx context.Context, r io.Reader) ([]string, error) {
	tmp, err := os.MkdirTemp(s.dir, ".import-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(tmp)
	if err := untar(ctx, r, tmp, false, maxLayoutBytes); err != nil {
		return nil, fmt.Errorf("image archive: %w", err)
	}
	idx, err := layout.ImageIndexFromPath(tmp)
	if err != nil {
		return nil, fmt.Errorf("image archive: %w", err)
	}
	man, err := idx.IndexManifest()
	if err != nil {
		return nil, fmt.Errorf("image archive: %w", err)
	}
	named := map[string]string{}
	for _, d := range man.Manifests {
		ref := d.Annotations[image.AnnotationRefName]
		if ref == "" {
			continue
		}
		img, err := idx.Image(d.Digest)
		if err != nil {
			return nil, fmt.Errorf("image %s: %w", ref, err)
		}
		if err := s.unpack(ctx, img, d.Digest.Hex); err != nil {
			return nil, fmt.Errorf("image %s: %w", ref, err)
		}
		named[ref] = d.Digest.Hex
	}
	if len(named) == 0 {
		return nil, errors.New("image archive names no image (annotation " + image.AnnotationRefName + ")")
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	refs, err := s.refs()
	if err != nil {
		return nil, err
	}
	out := make([]string, 0, len(named))
	for ref, hex := range named {
		refs[ref] = hex
		out = append(out, ref)
		s.cache.Delete(ref)
	}
	b, _ := json.Marshal(refs)
	if err := writeFileAtomic(filepath.Join(s.dir, "refs.json"), b); err != nil {
		return nil, err
	}
	return out, nil
}

// unpack flattens img's layers into <dir>/<hex>/rootfs, once.
func (s *imageStore) unpack(ctx context.Context, img v1.Image, hex string) error {
	final := filepath.Join(s.dir, hex)
	if _, err := os.Stat(filepath.Join(final, "config.json")); err == nil {
		return nil
	}
	cf, err := img.ConfigFile()
	if err != nil {
		return err
	}
	tmp, err := os.MkdirTemp(s.dir, ".unpack-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(tmp)
	rootfs := filepath.Join(tmp, "rootfs")
	if err := os.Mkdir(rootfs, 0o755); err != nil {
		return err
	}
	rc := mutate.Extract(img)
	err = untar(ctx, rc, rootfs, true, maxLayoutBytes)
	rc.Close()
	if err != nil {
		return fmt.Errorf("unpack: %w", err)
	}
	c := imageConfig{Entrypoint: cf.Config.Entrypoint, Cmd: cf.Config.Cmd, Env: cf.Config.Env,
		WorkingDir: cf.Config.WorkingDir, User: cf.Config.User}
	b, _ := json.Marshal(c)
	if err := os.WriteFile(filepath.Join(tmp, "config.json"), b, 0o644); err != nil {
		return err
	}
	_ = os.RemoveAll(final) // a half-unpacked leftover
	if err := os.Rename(tmp, final); err != nil {
		return err
	}
	return os.Chmod(final, 0o755)
}

// untar extracts r into dir. Every path is resolved inside dir (symlinks in
// the archive cannot lead out); device nodes are skipped. With owners it
// keeps the archive's uids, gids and modes (an image's root file system),
// otherwise files belong to the worker.
func untar(ctx context.Context, r io.Reader, dir string, owners bool, limit int64) error {
	tr := tar.NewReader(r)
	var total int64
	for {
		if err := ctx.Err(); err != nil {
			return err
		}
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return err
		}
		name := strings.TrimPrefix(filepath.Clean("/"+h.Name), "/")
		if name == "" {
			continue
		}
		path, err := securejoin.SecureJoin(dir, name)
		if err != nil {
			return err
		}
		mode := os.FileMode(h.Mode & 0o7777)
		switch h.Typeflag {
		case tar.TypeDir:
			if err := os.MkdirAll(path, 0o755); err != nil {
				return err
			}
		case tar.TypeReg:
			if total += h.Size; total > limit {
				return fmt.Errorf("more than %d bytes", limit)
			}
			if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
				return err
			}
			_ = os.Remove(path)
			f, err := os.OpenFile(path, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
			if err != nil {
				return err
			}
			_, err = io.Copy(f, io.LimitReader(tr, h.Size))
			if cerr := f.Close(); err == nil {
				err = cerr
			}
			if err != nil {
				return err
			}
		case tar.TypeSymlink:
			if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
				return err
			}
			_ = os.Remove(path)
			if err := os.Symlink(h.Linkname, path); err != nil {
				return err
			}
			if owners {
				_ = os.Lchown(path, h.Uid, h.Gid)
			}
			continue
		case tar.TypeLink:
			target, err := securejoin.SecureJoin(dir, strings.TrimPrefix(filepath.Clean("/"+h.Linkname), "/"))
			if err != nil {
				return err
			}
			_ = os.Remove(path)
			if err := os.Link(target, path); err != nil {
				return err
			}
			continue
		default:
			continue // devices, FIFOs: a sandbox gets its own /dev
		}
		if !owners {
			continue
		}
		if err := os.Lchown(path, h.Uid, h.Gid); err != nil {
			return err
		}
		if err := os.Chmod(path, mode); err != nil {
			return err
		}
	}
}

func writeFileAtomic(path string, b []byte) error {
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, b, 0o644); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}
