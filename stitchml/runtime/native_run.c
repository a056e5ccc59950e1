/* The host path of a prepared run in C (runtime/native_run.py builds and loads it).

   A Runner holds what a prepared run of an executable whose steps are all directly launched kernels
   needs: the template environment (constants, arena views), each feed's key and compiled
   (shape, dtype, device), each fresh output's allocator, each kernel's launch config and the parameter
   block that runtime/direct.py laid out (its memory stays the DirectLaunch's, which the runner holds),
   the result slots. A call does in C what _Prepared.__call__ does in Python. No cuda.h: the two
   driver entry points are received as addresses and declared here. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

typedef struct {  /* CUDA's CUlaunchConfig */
    unsigned grid_x, grid_y, grid_z, block_x, block_y, block_z, shared;
    void *stream;
    void *attrs;
    unsigned num_attrs;
} LaunchConfig;

typedef int (*launch_ex_t)(const LaunchConfig *, void *, void **, void **);
typedef int (*launch_t)(void *, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, void *,
                        void **, void **);

typedef struct {
    LaunchConfig config;
    void *function;
    void **params;          /* the parameter block: pointers to the addresses and the extents */
    uint64_t *addresses;    /* where the block's buffer parameters point, one per buffer */
    Py_ssize_t nbuf;
    Py_ssize_t *slots;      /* per buffer: its slot of the environment */
    uint64_t *masks;        /* and the bits of its address that must be zero (16-byte alignment, or none) */
    int ex_state;           /* 1: cuLaunchKernelEx accepted a launch; 0: not tried yet; -1: use cuLaunchKernel */
} Kernel;

typedef struct {
    PyObject_HEAD
    vectorcallfunc vectorcall;
    Py_ssize_t nslots;
    PyObject **template;    /* owned, NULL for an empty slot */
    Py_ssize_t nfeeds;
    PyObject **feed_key, **feed_shape, **feed_dtype;
    Py_ssize_t *feed_slot;
    long device;
    Py_ssize_t nout;
    Py_ssize_t *out_slot;
    PyObject **out_new, **out_args, **out_user, **out_shape, **out_dtype;  /* out_args: (shape, strides) */
    Py_ssize_t *out_count;  /* outputs allocated at once: the allocation is a block of that many, unbound */
    PyObject **out_pool;    /* the block's tensors not handed out yet (a tuple), or NULL */
    Py_ssize_t *out_next;   /* the next of them */
    Py_ssize_t nres;
    PyObject **res_user;
    Py_ssize_t *res_slot;
    int *res_held;
    Py_ssize_t nk;
    Kernel *kernels;
    launch_ex_t ex;
    launch_t plain;
    PyObject *stream_fn, *stream_arg, *acquire, *release, *resume, *exe, *graph, *tensor_type, *data_type, *keep;
    unsigned long long calls;  /* runs that launched every kernel here (reports, tests) */
    unsigned long long resumed;  /* runs that handed a kernel to `resume` */
} Runner;

static PyObject *s_dtype, *s_shape, *s_get_device, *s_is_contiguous, *s_data_ptr, *s_clone, *s_t, *s_runs,
    *s_run_count, *s_unbind, *one, *zero;

static int launch_nothing(void) { return 0; }
static PyObject *runner_call(Runner *r, PyObject *const *args, size_t nargsf, PyObject *kwnames);

static void runner_clear_arrays(Runner *r) {
    for (Py_ssize_t i = 0; r->template && i < r->nslots; i++) Py_XDECREF(r->template[i]);
    for (Py_ssize_t i = 0; r->feed_key && i < r->nfeeds; i++) {
        Py_XDECREF(r->feed_key[i]); Py_XDECREF(r->feed_shape[i]); Py_XDECREF(r->feed_dtype[i]);
    }
    for (Py_ssize_t i = 0; r->out_new && i < r->nout; i++) {
        Py_XDECREF(r->out_new[i]); Py_XDECREF(r->out_args[2 * i]); Py_XDECREF(r->out_args[2 * i + 1]);
        Py_XDECREF(r->out_user[i]); Py_XDECREF(r->out_shape[i]); Py_XDECREF(r->out_dtype[i]);
        Py_XDECREF(r->out_pool[i]);
    }
    for (Py_ssize_t i = 0; r->res_user && i < r->nres; i++) Py_XDECREF(r->res_user[i]);
    for (Py_ssize_t i = 0; r->kernels && i < r->nk; i++) {
        PyMem_Free(r->kernels[i].slots); PyMem_Free(r->kernels[i].masks);
    }
    PyMem_Free(r->template); PyMem_Free(r->feed_key); PyMem_Free(r->feed_shape); PyMem_Free(r->feed_dtype);
    PyMem_Free(r->feed_slot); PyMem_Free(r->out_slot); PyMem_Free(r->out_new); PyMem_Free(r->out_args);
    PyMem_Free(r->out_user); PyMem_Free(r->out_shape); PyMem_Free(r->out_dtype); PyMem_Free(r->res_user);
    PyMem_Free(r->out_count); PyMem_Free(r->out_pool); PyMem_Free(r->out_next);
    PyMem_Free(r->res_slot); PyMem_Free(r->res_held); PyMem_Free(r->kernels);
}

/* The runner holds its executable (for its counters) and the executable holds the runner (its prepared
   run): a cycle, which the garbage collector breaks through these two. */
static int runner_traverse(Runner *r, visitproc visit, void *arg) {
    for (Py_ssize_t i = 0; r->template && i < r->nslots; i++) Py_VISIT(r->template[i]);
    for (Py_ssize_t i = 0; r->feed_key && i < r->nfeeds; i++) {
        Py_VISIT(r->feed_key[i]); Py_VISIT(r->feed_shape[i]); Py_VISIT(r->feed_dtype[i]);
    }
    for (Py_ssize_t i = 0; r->out_new && i < r->nout; i++) {
        Py_VISIT(r->out_new[i]); Py_VISIT(r->out_args[2 * i]); Py_VISIT(r->out_args[2 * i + 1]);
        Py_VISIT(r->out_user[i]); Py_VISIT(r->out_shape[i]); Py_VISIT(r->out_dtype[i]); Py_VISIT(r->out_pool[i]);
    }
    for (Py_ssize_t i = 0; r->res_user && i < r->nres; i++) Py_VISIT(r->res_user[i]);
    Py_VISIT(r->stream_fn); Py_VISIT(r->stream_arg); Py_VISIT(r->acquire); Py_VISIT(r->release);
    Py_VISIT(r->resume); Py_VISIT(r->exe); Py_VISIT(r->graph); Py_VISIT(r->tensor_type); Py_VISIT(r->data_type);
    Py_VISIT(r->keep);
    return 0;
}

static int runner_clear(Runner *r) {
    runner_clear_arrays(r);
    r->template = NULL; r->feed_key = NULL; r->feed_shape = NULL; r->feed_dtype = NULL; r->feed_slot = NULL;
    r->out_slot = NULL; r->out_new = NULL; r->out_args = NULL; r->out_user = NULL; r->out_shape = NULL;
    r->out_dtype = NULL; r->out_count = NULL; r->out_pool = NULL; r->out_next = NULL; r->res_user = NULL;
    r->res_slot = NULL; r->res_held = NULL; r->kernels = NULL;
    r->nslots = r->nfeeds = r->nout = r->nres = r->nk = 0;
    r->vectorcall = NULL;  /* cleared: calls raise TypeError */
    Py_CLEAR(r->stream_fn); Py_CLEAR(r->stream_arg); Py_CLEAR(r->acquire); Py_CLEAR(r->release);
    Py_CLEAR(r->resume); Py_CLEAR(r->exe); Py_CLEAR(r->graph); Py_CLEAR(r->tensor_type); Py_CLEAR(r->data_type);
    Py_CLEAR(r->keep);
    return 0;
}

static void runner_dealloc(Runner *r) {
    PyObject_GC_UnTrack(r);
    runner_clear(r);
    Py_TYPE(r)->tp_free((PyObject *)r);
}

static void *alloc_zeroed(Py_ssize_t n, size_t size) {
    void *p = PyMem_Calloc(n > 0 ? (size_t)n : 1, size);
    if (p == NULL) PyErr_NoMemory();
    return p;
}

/* The integer at `index` of the tuple `t` (a Python int), or -1 with an error set. */
static long long item_int(PyObject *t, Py_ssize_t index) {
    return PyLong_AsLongLong(PyTuple_GET_ITEM(t, index));
}

static int need_tuple(PyObject *t, Py_ssize_t n, const char *what) {
    if (!PyTuple_Check(t) || PyTuple_GET_SIZE(t) != n) {
        PyErr_Format(PyExc_TypeError, "Runner: %s must be a tuple of %zd", what, n);
        return -1;
    }
    return 0;
}

/* Runner(nslots, template, feeds, device, outputs, results, kernels, ex, plain, stream_fn, stream_arg, lock,
          resume, exe, graph, tensor_type, data_type, keep)
   template: a list of nslots (None: empty); feeds: ((key, slot, shape, dtype), ...); outputs:
   ((slot, new, shape, strides, dtype, user or None), ...); results: ((user, slot, held), ...); kernels:
   ((function, (gx, gy, gz), (bx, by, bz), shared, params, addresses, ((slot, mask), ...)), ...), the
   addresses as ints; ex and plain: the addresses of cuLaunchKernelEx (0: none) and cuLaunchKernel. */
static int runner_init(Runner *r, PyObject *args, PyObject *kwds) {
    Py_ssize_t nslots;
    long device;
    unsigned long long ex, plain;
    PyObject *template, *feeds, *outputs, *results, *kernels, *lock;
    if (r->template != NULL) {
        PyErr_SetString(PyExc_TypeError, "Runner: already initialised");
        return -1;
    }
    if (!PyArg_ParseTuple(args, "nO!O!lO!O!O!KKOOOOOOOOO", &nslots, &PyList_Type, &template, &PyTuple_Type, &feeds,
                          &device, &PyTuple_Type, &outputs, &PyTuple_Type, &results, &PyTuple_Type, &kernels, &ex,
                          &plain, &r->stream_fn, &r->stream_arg, &lock, &r->resume, &r->exe, &r->graph,
                          &r->tensor_type, &r->data_type, &r->keep))
        return -1;
    Py_INCREF(r->stream_fn); Py_INCREF(r->stream_arg); Py_INCREF(r->resume); Py_INCREF(r->exe);
    Py_INCREF(r->graph); Py_INCREF(r->tensor_type); Py_INCREF(r->data_type); Py_INCREF(r->keep);
    if (PyList_GET_SIZE(template) != nslots || nslots < 0) {
        PyErr_SetString(PyExc_ValueError, "Runner: the template must have one entry per slot");
        return -1;
    }
    if (!PyType_Check(r->tensor_type) || !PyType_Check(r->data_type)) {
        PyErr_SetString(PyExc_TypeError, "Runner: tensor_type and data_type must be types");
        return -1;
    }
    r->acquire = PyObject_GetAttrString(lock, "acquire");
    r->release = r->acquire ? PyObject_GetAttrString(lock, "release") : NULL;
    if (r->release == NULL) return -1;
    r->vectorcall = (vectorcallfunc)runner_call;
    r->nslots = nslots;
    r->device = device;
    r->ex = (launch_ex_t)(uintptr_t)ex;
    r->plain = (launch_t)(uintptr_t)plain;
    if (!(r->template = alloc_zeroed(nslots, sizeof(PyObject *)))) return -1;
    for (Py_ssize_t i = 0; i < nslots; i++) {
        PyObject *v = PyList_GET_ITEM(template, i);
        r->template[i] = v == Py_None ? NULL : Py_NewRef(v);
    }
    r->nfeeds = PyTuple_GET_SIZE(feeds);
    if (!(r->feed_key = alloc_zeroed(r->nfeeds, sizeof(PyObject *))) ||
        !(r->feed_shape = alloc_zeroed(r->nfeeds, sizeof(PyObject *))) ||
        !(r->feed_dtype = alloc_zeroed(r->nfeeds, sizeof(PyObject *))) ||
        !(r->feed_slot = alloc_zeroed(r->nfeeds, sizeof(Py_ssize_t))))
        return -1;
    for (Py_ssize_t i = 0; i < r->nfeeds; i++) {
        PyObject *f = PyTuple_GET_ITEM(feeds, i);
        if (need_tuple(f, 4, "a feed") < 0) return -1;
        r->feed_key[i] = Py_NewRef(PyTuple_GET_ITEM(f, 0));
        r->feed_slot[i] = (Py_ssize_t)item_int(f, 1);
        r->feed_shape[i] = Py_NewRef(PyTuple_GET_ITEM(f, 2));
        r->feed_dtype[i] = Py_NewRef(PyTuple_GET_ITEM(f, 3));
        if (r->feed_slot[i] < 0 || r->feed_slot[i] >= nslots) {
            if (!PyErr_Occurred()) PyErr_SetString(PyExc_ValueError, "Runner: a feed's slot is out of range");
            return -1;
        }
    }
    r->nout = PyTuple_GET_SIZE(outputs);
    if (!(r->out_slot = alloc_zeroed(r->nout, sizeof(Py_ssize_t))) ||
        !(r->out_new = alloc_zeroed(r->nout, sizeof(PyObject *))) ||
        !(r->out_args = alloc_zeroed(2 * r->nout, sizeof(PyObject *))) ||
        !(r->out_user = alloc_zeroed(r->nout, sizeof(PyObject *))) ||
        !(r->out_shape = alloc_zeroed(r->nout, sizeof(PyObject *))) ||
        !(r->out_dtype = alloc_zeroed(r->nout, sizeof(PyObject *))) ||
        !(r->out_count = alloc_zeroed(r->nout, sizeof(Py_ssize_t))) ||
        !(r->out_pool = alloc_zeroed(r->nout, sizeof(PyObject *))) ||
        !(r->out_next = alloc_zeroed(r->nout, sizeof(Py_ssize_t))))
        return -1;
    for (Py_ssize_t i = 0; i < r->nout; i++) {
        PyObject *o = PyTuple_GET_ITEM(outputs, i);
        if (need_tuple(o, 7, "an output") < 0 || need_tuple(PyTuple_GET_ITEM(o, 2), 2, "an allocation") < 0)
            return -1;
        r->out_slot[i] = (Py_ssize_t)item_int(o, 0);
        r->out_new[i] = Py_NewRef(PyTuple_GET_ITEM(o, 1));
        r->out_args[2 * i] = Py_NewRef(PyTuple_GET_ITEM(PyTuple_GET_ITEM(o, 2), 0));
        r->out_args[2 * i + 1] = Py_NewRef(PyTuple_GET_ITEM(PyTuple_GET_ITEM(o, 2), 1));
        r->out_shape[i] = Py_NewRef(PyTuple_GET_ITEM(o, 3));
        r->out_dtype[i] = Py_NewRef(PyTuple_GET_ITEM(o, 4));
        r->out_user[i] = PyTuple_GET_ITEM(o, 5) == Py_None ? NULL : Py_NewRef(PyTuple_GET_ITEM(o, 5));
        r->out_count[i] = (Py_ssize_t)item_int(o, 6);
        if (r->out_count[i] < 1 && !PyErr_Occurred())
            PyErr_SetString(PyExc_ValueError, "Runner: an output's allocation count must be at least 1");
        if (PyErr_Occurred()) return -1;
        if (r->out_slot[i] < 0 || r->out_slot[i] >= nslots) {
            if (!PyErr_Occurred()) PyErr_SetString(PyExc_ValueError, "Runner: an output's slot is out of range");
            return -1;
        }
    }
    r->nres = PyTuple_GET_SIZE(results);
    if (!(r->res_user = alloc_zeroed(r->nres, sizeof(PyObject *))) ||
        !(r->res_slot = alloc_zeroed(r->nres, sizeof(Py_ssize_t))) ||
        !(r->res_held = alloc_zeroed(r->nres, sizeof(int))))
        return -1;
    for (Py_ssize_t i = 0; i < r->nres; i++) {
        PyObject *o = PyTuple_GET_ITEM(results, i);
        if (need_tuple(o, 3, "a result") < 0) return -1;
        r->res_user[i] = Py_NewRef(PyTuple_GET_ITEM(o, 0));
        r->res_slot[i] = (Py_ssize_t)item_int(o, 1);
        r->res_held[i] = PyObject_IsTrue(PyTuple_GET_ITEM(o, 2));
        if (r->res_slot[i] < 0 || r->res_slot[i] >= nslots) {
            if (!PyErr_Occurred()) PyErr_SetString(PyExc_ValueError, "Runner: a result's slot is out of range");
            return -1;
        }
    }
    r->nk = PyTuple_GET_SIZE(kernels);
    if (!(r->kernels = alloc_zeroed(r->nk, sizeof(Kernel)))) return -1;
    for (Py_ssize_t k = 0; k < r->nk; k++) {
        Kernel *K = &r->kernels[k];
        PyObject *o = PyTuple_GET_ITEM(kernels, k);
        if (need_tuple(o, 7, "a kernel") < 0) return -1;
        PyObject *grid = PyTuple_GET_ITEM(o, 1), *block = PyTuple_GET_ITEM(o, 2), *bufs = PyTuple_GET_ITEM(o, 6);
        if (need_tuple(grid, 3, "a grid") < 0 || need_tuple(block, 3, "a block") < 0 ||
            !PyTuple_Check(bufs)) {
            if (!PyErr_Occurred()) PyErr_SetString(PyExc_TypeError, "Runner: buffers must be a tuple");
            return -1;
        }
        K->function = (void *)(uintptr_t)PyLong_AsUnsignedLongLong(PyTuple_GET_ITEM(o, 0));
        K->config.grid_x = (unsigned)item_int(grid, 0);
        K->config.grid_y = (unsigned)item_int(grid, 1);
        K->config.grid_z = (unsigned)item_int(grid, 2);
        K->config.block_x = (unsigned)item_int(block, 0);
        K->config.block_y = (unsigned)item_int(block, 1);
        K->config.block_z = (unsigned)item_int(block, 2);
        K->config.shared = (unsigned)item_int(o, 3);
        K->params = (void **)(uintptr_t)PyLong_AsUnsignedLongLong(PyTuple_GET_ITEM(o, 4));
        K->addresses = (uint64_t *)(uintptr_t)PyLong_AsUnsignedLongLong(PyTuple_GET_ITEM(o, 5));
        K->ex_state = r->ex == NULL ? -1 : 0;
        K->nbuf = PyTuple_GET_SIZE(bufs);
        if (!(K->slots = alloc_zeroed(K->nbuf, sizeof(Py_ssize_t))) ||
            !(K->masks = alloc_zeroed(K->nbuf, sizeof(uint64_t))))
            return -1;
        for (Py_ssize_t b = 0; b < K->nbuf; b++) {
            PyObject *sb = PyTuple_GET_ITEM(bufs, b);
            if (need_tuple(sb, 2, "a buffer") < 0) return -1;
            K->slots[b] = (Py_ssize_t)item_int(sb, 0);
            K->masks[b] = (uint64_t)item_int(sb, 1);
            if (K->slots[b] < 0 || K->slots[b] >= nslots) {
                if (!PyErr_Occurred()) PyErr_SetString(PyExc_ValueError, "Runner: a buffer's slot is out of range");
                return -1;
            }
        }
        if (PyErr_Occurred()) return -1;
    }
    if (PyErr_Occurred()) return -1;
    return 0;
}

/* The tensor a feed or caller buffer holds: itself (an exact torch.Tensor) or a TensorData's; NULL for
   anything else. Borrowed: the caller's dictionary holds the value, the value its tensor. */
static PyObject *unwrap(Runner *r, PyObject *v) {
    if (Py_TYPE(v) == (PyTypeObject *)r->tensor_type) return v;
    if (Py_TYPE(v) != (PyTypeObject *)r->data_type) return NULL;
    PyObject *t = PyObject_GetAttr(v, s_t);
    if (t == NULL) {
        PyErr_Clear();
        return NULL;
    }
    Py_DECREF(t);  /* the TensorData's slot keeps it */
    return Py_TYPE(t) == (PyTypeObject *)r->tensor_type ? t : NULL;
}

/* 1 when `t` has the dtype, shape and device given, and is contiguous; 0 when not; -1 on an error. */
static int matches(Runner *r, PyObject *t, PyObject *shape, PyObject *dtype) {
    PyObject *v = PyObject_GetAttr(t, s_dtype);
    if (v == NULL) return -1;
    int ok = v == dtype;
    Py_DECREF(v);
    if (!ok) return 0;
    if (!(v = PyObject_GetAttr(t, s_shape))) return -1;
    ok = PyObject_RichCompareBool(v, shape, Py_EQ);
    Py_DECREF(v);
    if (ok != 1) return ok;
    if (!(v = PyObject_VectorcallMethod(s_get_device, &t, 1 | PY_VECTORCALL_ARGUMENTS_OFFSET, NULL))) return -1;
    long device = PyLong_AsLong(v);
    Py_DECREF(v);
    if (device == -1 && PyErr_Occurred()) return -1;
    if (device != r->device) return 0;
    if (!(v = PyObject_VectorcallMethod(s_is_contiguous, &t, 1 | PY_VECTORCALL_ARGUMENTS_OFFSET, NULL))) return -1;
    ok = v == Py_True;
    Py_DECREF(v);
    return ok;
}

/* Launch kernel `K` over `env` on `stream`: 0 when launched, 1 when it must go through `resume` (a buffer
   off its alignment, the driver refusing the launch, an address that could not be read). */
static int launch(Runner *r, Kernel *K, PyObject **env, void *stream) {
    for (Py_ssize_t b = 0; b < K->nbuf; b++) {
        PyObject *t = env[K->slots[b]];
        if (t == NULL) return 1;
        PyObject *p = PyObject_VectorcallMethod(s_data_ptr, &t, 1 | PY_VECTORCALL_ARGUMENTS_OFFSET, NULL);
        if (p == NULL) {
            PyErr_Clear();
            return 1;
        }
        uint64_t ptr = (uint64_t)PyLong_AsUnsignedLongLong(p);
        Py_DECREF(p);
        if (ptr == (uint64_t)-1 && PyErr_Occurred()) {
            PyErr_Clear();
            return 1;
        }
        if (ptr & K->masks[b]) return 1;
        K->addresses[b] = ptr;
    }
    K->config.stream = stream;
    if (K->ex_state >= 0) {
        if (r->ex(&K->config, K->function, K->params, NULL) == 0) {
            K->ex_state = 1;
            return 0;
        }
        if (K->ex_state == 1) return 1;  /* a failure of this launch, not of the entry: resume raises it */
        K->ex_state = -1;  /* refused before it ever launched: the driver has the entry but not its config */
    }
    LaunchConfig *c = &K->config;
    return r->plain(K->function, c->grid_x, c->grid_y, c->grid_z, c->block_x, c->block_y, c->block_z, c->shared,
                    stream, K->params, NULL) != 0;
}

static int bump(PyObject *obj, PyObject *name) {
    PyObject *v = PyObject_GetAttr(obj, name);
    if (v == NULL) return -1;
    PyObject *w = PyNumber_Add(v, one);
    Py_DECREF(v);
    if (w == NULL) return -1;
    int rc = PyObject_SetAttr(obj, name, w);
    Py_DECREF(w);
    return rc;
}

/* A fresh output `i`: allocated now, or the next tensor of a block of `out_count` of them allocated at once
   (one allocation and one `unbind` for that many outputs: a view costs less host time than an allocation). */
static PyObject *allocate(Runner *r, Py_ssize_t i) {
    if (r->out_count[i] == 1) return PyObject_Vectorcall(r->out_new[i], &r->out_args[2 * i], 2, NULL);
    PyObject *pool = r->out_pool[i];
    if (pool != NULL && r->out_next[i] < PyTuple_GET_SIZE(pool))  /* no Python code runs up to the return */
        return Py_NewRef(PyTuple_GET_ITEM(pool, r->out_next[i]++));
    PyObject *block = PyObject_Vectorcall(r->out_new[i], &r->out_args[2 * i], 2, NULL);
    if (block == NULL) return NULL;
    PyObject *parts = PyObject_CallMethodOneArg(block, s_unbind, zero);
    Py_DECREF(block);
    if (parts == NULL) return NULL;
    if (!PyTuple_CheckExact(parts) || PyTuple_GET_SIZE(parts) != r->out_count[i]) {
        Py_DECREF(parts);
        PyErr_SetString(PyExc_RuntimeError, "Runner: unbind did not give one tensor per output");
        return NULL;
    }
    PyObject *first = Py_NewRef(PyTuple_GET_ITEM(parts, 0)), *old = r->out_pool[i];
    r->out_pool[i] = parts;
    r->out_next[i] = 1;
    Py_XDECREF(old);
    return first;
}

#define SMALL 32

/* runner(feeds, outputs=None): the run's {target: TensorData}, or None (nothing run) where a feed or
   caller buffer misses what was prepared. */
static PyObject *runner_call(Runner *r, PyObject *const *args, size_t nargsf, PyObject *kwnames) {
    Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
    if (kwnames != NULL || nargs < 1 || nargs > 2) {
        PyErr_SetString(PyExc_TypeError, "Runner(feeds, outputs=None)");
        return NULL;
    }
    PyObject *feeds = args[0], *outputs = nargs > 1 ? args[1] : Py_None;
    if (!PyDict_CheckExact(feeds) || PyDict_GET_SIZE(feeds) != r->nfeeds) Py_RETURN_NONE;
    if (outputs != Py_None && (!PyDict_CheckExact(outputs))) {
        int truth = PyObject_IsTrue(outputs);
        if (truth < 0) return NULL;
        if (truth) Py_RETURN_NONE;  /* another mapping: the general path binds or copies */
        outputs = Py_None;
    }
    PyObject *small[SMALL], **env = small;
    unsigned char fresh_small[SMALL], *fresh = fresh_small;  /* 1: env holds a reference of ours */
    if (r->nslots > SMALL) {
        env = PyMem_Malloc(r->nslots * sizeof(PyObject *));
        fresh = PyMem_Malloc(r->nslots);
        if (env == NULL || fresh == NULL) {
            PyMem_Free(env == small ? NULL : env);
            PyMem_Free(fresh == fresh_small ? NULL : fresh);
            return PyErr_NoMemory();
        }
    }
    memcpy(env, r->template, r->nslots * sizeof(PyObject *));
    memset(fresh, 0, r->nslots);
    PyObject *result = NULL;
    int locked = 0, ok, resumed = 0;
    for (Py_ssize_t i = 0; i < r->nfeeds; i++) {
        PyObject *v = PyDict_GetItemWithError(feeds, r->feed_key[i]);
        if (v == NULL) {
            if (PyErr_Occurred()) goto done;
            goto miss;
        }
        PyObject *t = unwrap(r, v);
        if (t == NULL) goto miss;
        if ((ok = matches(r, t, r->feed_shape[i], r->feed_dtype[i])) < 0) goto done;
        if (!ok) goto miss;
        env[r->feed_slot[i]] = t;
    }
    if (outputs != Py_None && PyDict_GET_SIZE(outputs) > 0) {
        Py_ssize_t bound = 0;
        for (Py_ssize_t i = 0; i < r->nout; i++) {
            if (r->out_user[i] == NULL) continue;
            PyObject *v = PyDict_GetItemWithError(outputs, r->out_user[i]);
            if (v == NULL) {
                if (PyErr_Occurred()) goto done;
                continue;
            }
            PyObject *t = unwrap(r, v);
            if (t == NULL || env[r->out_slot[i]] != NULL) goto miss;
            if ((ok = matches(r, t, r->out_shape[i], r->out_dtype[i])) < 0) goto done;
            if (!ok) goto miss;
            env[r->out_slot[i]] = t;
            bound++;
        }
        if (bound != PyDict_GET_SIZE(outputs)) goto miss;  /* a target that is not a fresh output */
    }
    for (Py_ssize_t i = 0; i < r->nout; i++) {
        Py_ssize_t slot = r->out_slot[i];
        if (env[slot] != NULL) continue;  /* a caller's buffer */
        PyObject *t = allocate(r, i);
        if (t == NULL) goto done;
        env[slot] = t;
        fresh[slot] = 1;
    }
    PyObject *got = PyObject_CallNoArgs(r->acquire);
    if (got == NULL) goto done;
    Py_DECREF(got);
    locked = 1;
    PyObject *s = PyObject_Vectorcall(r->stream_fn, &r->stream_arg, 1, NULL);
    if (s == NULL) goto done;
    void *stream = PyLong_AsVoidPtr(s);
    Py_DECREF(s);
    if (stream == NULL && PyErr_Occurred()) goto done;
    for (Py_ssize_t k = 0; k < r->nk; k++) {
        if (launch(r, &r->kernels[k], env, stream) == 0) continue;
        /* the rest through the steps in Python (Triton's launcher), whose failures become typed errors */
        PyObject *list = PyList_New(r->nslots);
        if (list == NULL) goto done;
        for (Py_ssize_t i = 0; i < r->nslots; i++) PyList_SET_ITEM(list, i, Py_NewRef(env[i] ? env[i] : Py_None));
        PyObject *at = PyLong_FromSsize_t(k);
        PyObject *rc = at ? PyObject_CallFunctionObjArgs(r->resume, list, at, NULL) : NULL;
        Py_XDECREF(at);
        if (rc == NULL) {
            Py_DECREF(list);
            goto done;
        }
        Py_DECREF(rc);
        resumed = 1;
        for (Py_ssize_t i = 0; i < r->nslots; i++) {  /* the slots as the steps left them */
            PyObject *v = PyList_GET_ITEM(list, i);
            if (fresh[i]) Py_DECREF(env[i]);
            env[i] = v == Py_None ? NULL : Py_NewRef(v);
            fresh[i] = env[i] != NULL;
        }
        Py_DECREF(list);
        break;
    }
    if (!(result = PyDict_New())) goto done;
    for (Py_ssize_t i = 0; i < r->nres; i++) {
        PyObject *v = env[r->res_slot[i]];
        if (v == NULL) {
            PyErr_SetString(PyExc_RuntimeError, "a run left a result slot empty");
            Py_CLEAR(result);
            goto done;
        }
        v = r->res_held[i] ? PyObject_VectorcallMethod(s_clone, &v, 1 | PY_VECTORCALL_ARGUMENTS_OFFSET, NULL)
                           : Py_NewRef(v);
        PyObject *data = v ? ((PyTypeObject *)r->data_type)->tp_alloc((PyTypeObject *)r->data_type, 0) : NULL;
        if (data == NULL || PyObject_SetAttr(data, s_t, v) < 0 ||
            PyDict_SetItem(result, r->res_user[i], data) < 0) {
            Py_XDECREF(v);
            Py_XDECREF(data);
            Py_CLEAR(result);
            goto done;
        }
        Py_DECREF(v);
        Py_DECREF(data);
    }
    if (bump(r->exe, s_runs) < 0 || bump(r->graph, s_run_count) < 0) {
        Py_CLEAR(result);
        goto done;
    }
    if (resumed) r->resumed++;
    else r->calls++;
    goto done;
miss:
    result = Py_NewRef(Py_None);
done:
    if (locked) {
        PyObject *type, *value, *tb;
        PyErr_Fetch(&type, &value, &tb);
        PyObject *rc = PyObject_CallNoArgs(r->release);
        if (rc == NULL) Py_CLEAR(result);
        Py_XDECREF(rc);
        if (type != NULL) {
            if (rc == NULL) PyErr_Clear();
            PyErr_Restore(type, value, tb);
        }
    }
    for (Py_ssize_t i = 0; i < r->nslots; i++)
        if (fresh[i]) Py_DECREF(env[i]);
    if (env != small) {
        PyMem_Free(env);
        PyMem_Free(fresh);
    }
    return result;
}

static PyObject *runner_set_launchers(Runner *r, PyObject *args) {
    unsigned long long ex, plain;
    if (!PyArg_ParseTuple(args, "KK", &ex, &plain)) return NULL;
    r->ex = (launch_ex_t)(uintptr_t)ex;
    r->plain = (launch_t)(uintptr_t)plain;
    for (Py_ssize_t k = 0; k < r->nk; k++) r->kernels[k].ex_state = ex ? 0 : -1;
    Py_RETURN_NONE;
}

static PyObject *runner_launchers(Runner *r, PyObject *unused) {
    return Py_BuildValue("KK", (unsigned long long)(uintptr_t)r->ex, (unsigned long long)(uintptr_t)r->plain);
}

static PyObject *runner_entries(Runner *r, PyObject *unused) {
    PyObject *out = PyTuple_New(r->nk);
    for (Py_ssize_t k = 0; out && k < r->nk; k++) {
        int s = r->kernels[k].ex_state;
        PyTuple_SET_ITEM(out, k, PyUnicode_FromString(s > 0 ? "cuLaunchKernelEx" : s < 0 ? "cuLaunchKernel"
                                                                                      : "not launched yet"));
    }
    return out;
}

static PyObject *runner_counts(Runner *r, void *unused) {
    return Py_BuildValue("KK", r->calls, r->resumed);
}

static PyMethodDef runner_methods[] = {
    {"set_launchers", (PyCFunction)runner_set_launchers, METH_VARARGS,
     "set_launchers(ex, plain): the addresses of the Ex entry (0: none) and of cuLaunchKernel"},
    {"launchers", (PyCFunction)runner_launchers, METH_NOARGS, "launchers() -> (ex, plain) addresses"},
    {"entries", (PyCFunction)runner_entries, METH_NOARGS, "the driver entry each kernel launches through"},
    {NULL}};

static PyGetSetDef runner_getset[] = {
    {"counts", (getter)runner_counts, NULL, "(runs launched here, runs that resumed in Python)", NULL}, {NULL}};

static PyTypeObject RunnerType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "stitchml_native_run.Runner",
    .tp_basicsize = sizeof(Runner),
    .tp_dealloc = (destructor)runner_dealloc,
    .tp_vectorcall_offset = offsetof(Runner, vectorcall),
    .tp_call = PyVectorcall_Call,
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_VECTORCALL | Py_TPFLAGS_HAVE_GC,
    .tp_traverse = (traverseproc)runner_traverse,
    .tp_clear = (inquiry)runner_clear,
    .tp_doc = "A prepared run launched from C (runtime/native_run.py).",
    .tp_methods = runner_methods,
    .tp_getset = runner_getset,
    .tp_init = (initproc)runner_init,
    .tp_new = PyType_GenericNew,
};


/* A graph's lookup of a request seen before (runtime/compiled.py's ExecutableCache.quick) in C: the key of
   identities `_request_key` builds, the cache's `_recent` entry by it, and the run of that executable's
   prepared run. None (nothing run) where the request has another form (options, a torch.device: the
   Python lookup takes those), no entry, or the prepared run misses. */
typedef struct {
    PyObject_HEAD
    vectorcallfunc vectorcall;
    PyObject *cache, *recent, *entries, *tensor_type, *op_type, *current, *get_device;
    PyObject *fallback;  /* the Python lookup, for requests of another form (compile options, a torch.device) */
    int cuda_ready;  /* the current CUDA device may be read directly (CUDA is initialised; it stays so) */
} Lookup;

static PyObject *s_prepared, *s_move_to_end, *s_fast_hits, *s_cpu, *s_colon;

/* The lookup holds its cache and the cache holds the lookup (its `quick`): collectable, as the runner. */
static int lookup_traverse(Lookup *l, visitproc visit, void *arg) {
    Py_VISIT(l->cache); Py_VISIT(l->recent); Py_VISIT(l->entries); Py_VISIT(l->tensor_type); Py_VISIT(l->op_type);
    Py_VISIT(l->current); Py_VISIT(l->get_device); Py_VISIT(l->fallback);
    return 0;
}

static int lookup_clear(Lookup *l) {
    l->vectorcall = NULL;
    Py_CLEAR(l->cache); Py_CLEAR(l->recent); Py_CLEAR(l->entries); Py_CLEAR(l->tensor_type); Py_CLEAR(l->op_type);
    Py_CLEAR(l->current); Py_CLEAR(l->get_device); Py_CLEAR(l->fallback);
    return 0;
}

static void lookup_dealloc(Lookup *l) {
    PyObject_GC_UnTrack(l);
    lookup_clear(l);
    Py_TYPE(l)->tp_free((PyObject *)l);
}

static PyObject *lookup_call(Lookup *l, PyObject *const *args, size_t nargsf, PyObject *kwnames);

/* Lookup(cache, recent, entries, tensor_type, op_type, current, get_device, fallback): `current(device)` is
   `_current_cuda`, `get_device` torch's current-device call (None on builds without CUDA), `fallback` the
   Python lookup of the same arguments. */
static int lookup_init(Lookup *l, PyObject *args, PyObject *kwds) {
    if (l->cache != NULL) {
        PyErr_SetString(PyExc_TypeError, "Lookup: already initialised");
        return -1;
    }
    if (!PyArg_ParseTuple(args, "OO!OOOOOO", &l->cache, &PyDict_Type, &l->recent, &l->entries, &l->tensor_type,
                          &l->op_type, &l->current, &l->get_device, &l->fallback))
        return -1;
    Py_INCREF(l->cache); Py_INCREF(l->recent); Py_INCREF(l->entries); Py_INCREF(l->tensor_type);
    Py_INCREF(l->op_type); Py_INCREF(l->current); Py_INCREF(l->get_device); Py_INCREF(l->fallback);
    l->vectorcall = (vectorcallfunc)lookup_call;
    return 0;
}

/* Append the identities of a targets or target-ops argument to `key`; 0, 1 (another form) or -1. */
static int add_ids(PyObject *key, PyObject *seq, PyObject *single) {
    if (Py_TYPE(seq) == (PyTypeObject *)single) {
        PyObject *id = PyLong_FromVoidPtr(seq);
        int rc = id ? PyList_Append(key, id) : -1;
        Py_XDECREF(id);
        return rc;
    }
    if (!PyList_CheckExact(seq) && !PyTuple_CheckExact(seq)) return 1;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    PyObject **items = PySequence_Fast_ITEMS(seq);
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *id = PyLong_FromVoidPtr(items[i]);
        int rc = id ? PyList_Append(key, id) : -1;
        Py_XDECREF(id);
        if (rc < 0) return -1;
    }
    return 0;
}

static Py_ssize_t count(PyObject *seq, PyObject *single) {
    return Py_TYPE(seq) == (PyTypeObject *)single ? 1 : PySequence_Fast_GET_SIZE(seq);
}

/* lookup(feeds, targets, target_ops, device, compiled, options) */
static PyObject *lookup_call(Lookup *l, PyObject *const *args, size_t nargsf, PyObject *kwnames) {
    if (kwnames != NULL || PyVectorcall_NARGS(nargsf) != 6) {
        PyErr_SetString(PyExc_TypeError, "Lookup(feeds, targets, target_ops, device, compiled, options)");
        return NULL;
    }
    PyObject *feeds = args[0], *targets = args[1], *ops = args[2], *device = args[3], *compiled = args[4];
    if (PyDict_GET_SIZE(l->recent) == 0) Py_RETURN_NONE;
    int truth = PyObject_IsTrue(args[5]);
    if (truth < 0) return NULL;
    if (truth) return PyObject_Vectorcall(l->fallback, args, 6, NULL);  /* compile options: their key is Python's */
    if (feeds != Py_None && !PyDict_CheckExact(feeds)) Py_RETURN_NONE;
    if (Py_TYPE(targets) != (PyTypeObject *)l->tensor_type && !PyList_CheckExact(targets) &&
        !PyTuple_CheckExact(targets))
        Py_RETURN_NONE;
    if (Py_TYPE(ops) != (PyTypeObject *)l->op_type && !PyList_CheckExact(ops) && !PyTuple_CheckExact(ops))
        Py_RETURN_NONE;
    PyObject *current = Py_None;  /* borrowed, or `owned` */
    PyObject *owned = NULL;
    int through_current;
    if (device == Py_None) {
        through_current = 1;
    } else if (PyUnicode_CheckExact(device)) {
        through_current = PyUnicode_Compare(device, s_cpu) != 0 && PyUnicode_Find(device, s_colon, 0,
                                                                                  PY_SSIZE_T_MAX, 1) == -1;
        if (PyErr_Occurred()) return NULL;
    } else {
        return PyObject_Vectorcall(l->fallback, args, 6, NULL);  /* a torch.device, or something to report */
    }
    if (through_current && l->get_device != Py_None) {
        owned = l->cuda_ready ? PyObject_CallNoArgs(l->get_device) : PyObject_CallOneArg(l->current, device);
        if (owned == NULL) return NULL;
        if (owned != Py_None) l->cuda_ready = 1;
        current = owned;
    }
    PyObject *key = PyList_New(0), *result = NULL;
    if (key == NULL) {
        Py_XDECREF(owned);
        return NULL;
    }
    PyObject *nfeeds = PyLong_FromSsize_t(feeds == Py_None ? 0 : PyDict_GET_SIZE(feeds));
    PyObject *ntargets = PyLong_FromSsize_t(count(targets, l->tensor_type));
    PyObject *empty = PyTuple_New(0);
    PyObject *head[] = {device, current, compiled, empty, nfeeds, ntargets};
    int rc = nfeeds && ntargets && empty ? 0 : -1;
    for (int i = 0; rc == 0 && i < 6; i++) rc = PyList_Append(key, head[i]);
    Py_XDECREF(nfeeds); Py_XDECREF(ntargets); Py_XDECREF(empty); Py_XDECREF(owned);
    if (rc == 0 && feeds != Py_None) {
        Py_ssize_t pos = 0;
        PyObject *k, *v;
        while (rc == 0 && PyDict_Next(feeds, &pos, &k, &v)) {
            PyObject *id = PyLong_FromVoidPtr(k);
            rc = id ? PyList_Append(key, id) : -1;
            Py_XDECREF(id);
        }
    }
    if (rc == 0) rc = add_ids(key, targets, l->tensor_type);
    if (rc == 0) rc = add_ids(key, ops, l->op_type);
    if (rc != 0) {
        Py_DECREF(key);
        if (rc < 0) return NULL;
        Py_RETURN_NONE;
    }
    PyObject *tuple = PyList_AsTuple(key);
    Py_DECREF(key);
    if (tuple == NULL) return NULL;
    PyObject *hit = PyDict_GetItemWithError(l->recent, tuple);  /* borrowed: (signature, executable, held) */
    Py_DECREF(tuple);
    if (hit == NULL) {
        if (PyErr_Occurred()) return NULL;
        Py_RETURN_NONE;
    }
    Py_INCREF(hit);  /* another thread may drop the entry while the run goes */
    PyObject *prepared = PyObject_GetAttr(PyTuple_GET_ITEM(hit, 1), s_prepared);
    if (prepared == NULL || prepared == Py_None) {
        Py_DECREF(hit);
        if (prepared == NULL) return NULL;
        return prepared;
    }
    PyObject *call[] = {feeds, Py_None};
    result = PyObject_Vectorcall(prepared, call, 2, NULL);
    Py_DECREF(prepared);
    if (result != NULL && result != Py_None) {
        PyObject *moved = PyObject_CallMethodOneArg(l->entries, s_move_to_end, PyTuple_GET_ITEM(hit, 0));
        if (moved != NULL)
            Py_DECREF(moved);
        else if (PyErr_ExceptionMatches(PyExc_KeyError))
            PyErr_Clear();  /* evicted by another thread meanwhile: this run was still its executable's */
        else
            Py_CLEAR(result);
        if (result != NULL && bump(l->cache, s_fast_hits) < 0) Py_CLEAR(result);
    }
    Py_DECREF(hit);
    return result;
}

static PyTypeObject LookupType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "stitchml_native_run.Lookup",
    .tp_basicsize = sizeof(Lookup),
    .tp_dealloc = (destructor)lookup_dealloc,
    .tp_vectorcall_offset = offsetof(Lookup, vectorcall),
    .tp_call = PyVectorcall_Call,
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_VECTORCALL | Py_TPFLAGS_HAVE_GC,
    .tp_traverse = (traverseproc)lookup_traverse,
    .tp_clear = (inquiry)lookup_clear,
    .tp_doc = "A graph's lookup of a request seen before (runtime/native_run.py).",
    .tp_init = (initproc)lookup_init,
    .tp_new = PyType_GenericNew,
};

static PyObject *noop_launch(PyObject *self, PyObject *unused) {
    return PyLong_FromUnsignedLongLong((unsigned long long)(uintptr_t)&launch_nothing);
}

static PyMethodDef module_methods[] = {
    {"noop_launch", noop_launch, METH_NOARGS,
     "the address of a launch entry that launches nothing and succeeds (host-time measurements)"},
    {NULL}};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "stitchml_native_run", NULL, -1, module_methods};

PyMODINIT_FUNC PyInit_stitchml_native_run(void) {
    if (PyType_Ready(&RunnerType) < 0 || PyType_Ready(&LookupType) < 0) return NULL;
    const char *names[] = {"dtype", "shape", "get_device", "is_contiguous", "data_ptr", "clone", "_t", "runs",
                           "run_count"};
    PyObject **slots[] = {&s_dtype, &s_shape, &s_get_device, &s_is_contiguous, &s_data_ptr, &s_clone, &s_t,
                          &s_runs, &s_run_count};
    for (int i = 0; i < 9; i++)
        if (!(*slots[i] = PyUnicode_InternFromString(names[i]))) return NULL;
    if (!(one = PyLong_FromLong(1)) || !(zero = PyLong_FromLong(0)) ||
        !(s_unbind = PyUnicode_InternFromString("unbind")))
        return NULL;
    const char *more[] = {"_prepared", "move_to_end", "fast_hits", "cpu", ":"};
    PyObject **more_slots[] = {&s_prepared, &s_move_to_end, &s_fast_hits, &s_cpu, &s_colon};
    for (int i = 0; i < 5; i++)
        if (!(*more_slots[i] = PyUnicode_InternFromString(more[i]))) return NULL;
    PyObject *m = PyModule_Create(&module);
    if (m == NULL) return NULL;
    Py_INCREF(&RunnerType);
    if (PyModule_AddObject(m, "Runner", (PyObject *)&RunnerType) < 0) {
        Py_DECREF(&RunnerType);
        Py_DECREF(m);
        return NULL;
    }
    Py_INCREF(&LookupType);
    if (PyModule_AddObject(m, "Lookup", (PyObject *)&LookupType) < 0) {
        Py_DECREF(&LookupType);
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
