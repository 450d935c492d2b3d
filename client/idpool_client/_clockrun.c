/* idpool_client._clockrun: the snowflake client's hot path in C (optional).
 *
 * ClockRun(first, limit, until_boot_ns) iterates first, first + 1, ... below
 * limit, and ends (StopIteration, for good) at the first draw at which
 * CLOCK_BOOTTIME (the snowflake client's lease_clock: real time, suspend and
 * pauses included, whatever the wall clock does) is at or past until_boot_ns,
 * the run's deadline (its unit's end on the wall clock, projected onto this
 * clock when the run was made, or the lease's, whichever is first). The number
 * drawn then is skipped, never handed out. Linux only (CLOCK_BOOTTIME):
 * elsewhere the build of this optional module fails and the client runs the
 * same logic in Python.
 *
 * It does in one C call what idpool_client.snowflake's pure-Python run does with
 * a range iterator and a clock read per ID (a Python call and a float of its
 * own, as costly as the segment client's whole next_id). __next__
 * holds the GIL throughout and calls no Python code: two threads never draw the
 * same number, and the clock is read after the number is taken, so a thread
 * paused between the two finds the unit over and hands out nothing of it.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <time.h>

#ifndef CLOCK_BOOTTIME
#error "CLOCK_BOOTTIME is needed (Linux): the client falls back to Python"
#endif

typedef struct {
    PyObject_HEAD
    long long next;     /* the next number to hand out */
    long long limit;    /* the first number never handed out */
    long long until_boot_ns; /* the CLOCK_BOOTTIME time (ns) the run ends at */
} ClockRun;

static int
ClockRun_init(ClockRun *self, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"first", "limit", "until_boot_ns", NULL};
    long long first, limit, until_boot_ns;
    if (!PyArg_ParseTupleAndKeywords(
            args, kwds, "LLL", kwlist, &first, &limit, &until_boot_ns))
        return -1;
    self->next = first;
    self->limit = limit;
    self->until_boot_ns = until_boot_ns;
    return 0;
}

static PyObject *
ClockRun_iternext(ClockRun *self)
{
    struct timespec boot;
    long long value;
    if (self->next >= self->limit)
        return NULL;
    value = self->next++;
    if (clock_gettime(CLOCK_BOOTTIME, &boot) != 0
        || (long long)boot.tv_sec * 1000000000LL + boot.tv_nsec >= self->until_boot_ns) {
        self->next = self->limit; /* over: nothing more from this run */
        return NULL;
    }
    return PyLong_FromLongLong(value);
}

static PyObject *
ClockRun_end(ClockRun *self, PyObject *Py_UNUSED(ignored))
{
    self->next = self->limit;
    Py_RETURN_NONE;
}

static PyMethodDef ClockRun_methods[] = {
    {"end", (PyCFunction)ClockRun_end, METH_NOARGS,
     "End the run now: a thread that holds it draws nothing more."},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject ClockRunType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "idpool_client._clockrun.ClockRun",
    .tp_doc = PyDoc_STR("first, first + 1, ... below limit, while CLOCK_BOOTTIME is before "
                        "until_boot_ns"),
    .tp_basicsize = sizeof(ClockRun),
    .tp_itemsize = 0,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)ClockRun_init,
    .tp_iter = PyObject_SelfIter,
    .tp_iternext = (iternextfunc)ClockRun_iternext,
    .tp_methods = ClockRun_methods,
};

static struct PyModuleDef clockrun_module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "idpool_client._clockrun",
    .m_doc = "The snowflake client's run of one time unit, in C (optional).",
    .m_size = -1,
};

PyMODINIT_FUNC
PyInit__clockrun(void)
{
    PyObject *m;
    if (PyType_Ready(&ClockRunType) < 0)
        return NULL;
    m = PyModule_Create(&clockrun_module);
    if (m == NULL)
        return NULL;
    Py_INCREF(&ClockRunType);
    if (PyModule_AddObject(m, "ClockRun", (PyObject *)&ClockRunType) < 0) {
        Py_DECREF(&ClockRunType);
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
