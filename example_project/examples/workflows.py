"""The examples of the durable-execution README, written the django-durable way.

Each workflow's docstring gives the input and the output the README documents. Tasks become
steps; "parent tasks with parallel children" become ctx.parallel(); a "finalize task" is just the
code after it; "sequential tasks" are steps one after the other; nested parents are child
workflows.
"""

import time

from django.utils import timezone

import django_durable as durable

# -- simple tasks ------------------------------------------------------------------------------


def hello(name):
    return f"Hello, {name}!"


@durable.workflow("examples.simple")
def simple(ctx, name):
    """Simple sync task. Input: name="world". Output: "Hello, world!"."""
    return ctx.step("a", hello, name)


def hello_later(name):
    time.sleep(0.001)  # some asynchronous work
    return f"Hello, {name}!"


@durable.workflow("examples.simple_async")
def simple_async(ctx, name):
    """Simple async task. Input: name="world". Output: "Hello, world!"."""
    return ctx.step("a", hello_later, name)


@durable.workflow("examples.validate_input")
def validate_input(ctx, name="world"):
    """Validate input. Input: name="world". Output: "Hello, world!"; any other name fails the run."""
    if name != "world":
        raise ValueError("Invalid input")
    return ctx.step("a", hello, name)


@durable.workflow("examples.validate_input_schema")
def validate_input_schema(ctx, name="world"):
    """Validate input with a schema (here: a str). Input: name="world". Output: "Hello, world!"."""
    if not isinstance(name, str):
        raise TypeError(f"name must be a string, not {type(name).__name__}")
    return ctx.step("a", hello, name)


def hello_on_the_third_attempt(name):
    attempt = durable.current_step().attempt
    if attempt < 3:
        raise RuntimeError("Failed")
    return {"totalAttempts": attempt, "output": f"Hello, {name}!"}


@durable.workflow("examples.retries")
def retries(ctx, name):
    """Retries. Input: name="world". Output: {"totalAttempts": 3, "output": "Hello, world!"}."""
    policy = durable.RetryPolicy(max_attempts=5, initial_backoff=0.1, backoff_coefficient=1.5, max_backoff=1)
    return ctx.step("a", hello_on_the_third_attempt, name, retry=policy)


def describe_step():
    info = durable.current_step()
    return {"taskId": info.key, "executionId": str(info.run_id), "attempt": info.attempt, "prevError": None}


@durable.workflow("examples.run_context")
def run_context(ctx):
    """Task run context. Output: {"taskId": "a", "executionId": <the run id>, "attempt": 1, "prevError": None}."""
    return ctx.step("a", describe_step)


# -- parents, children and finalize --------------------------------------------------------------


def hello_from(task, name):
    return f"Hello from task {task}, {name}!"


@durable.workflow("examples.parent_with_children")
def parent_with_children(ctx, name):
    """Parent task with parallel children. Input: name="world".

    Output: {"output": "Hello from parent task, world!", "childrenOutputs": [
    {"output": "Hello from task A, world!"}, {"output": "Hello from task B, world!"}]}.
    """
    output = ctx.step("parent", hello_from, "parent", name).replace("task parent", "parent task")
    children = ctx.parallel([ctx.call("a", hello_from, "A", name), ctx.call("b", hello_from, "B", name)])
    return {"output": output, "childrenOutputs": [{"output": child} for child in children]}


@durable.workflow("examples.parent_with_finalize")
def parent_with_finalize(ctx, name):
    """Parent task with parallel children and combined output. Input: name="world".

    Output: {"parentOutput": "Hello from parent task, world!", "taskAOutput": "Hello from task A,
    world!", "taskBOutput": "Hello from task B, world!"}.
    """
    output = ctx.step("parent", hello_from, "parent", name).replace("task parent", "parent task")
    task_a, task_b = ctx.parallel([ctx.call("a", hello_from, "A", name), ctx.call("b", hello_from, "B", name)])
    # The "finalize task": the workflow code after the children.
    return {"parentOutput": output, "taskAOutput": task_a, "taskBOutput": task_b}


@durable.workflow("examples.sequential")
def sequential(ctx, name):
    """Sequential tasks a, b, c. Input: name="world".

    Output: {"taskAOutput": "Hello from task A, world!", "taskBOutput": "Hello from task B,
    world!", "taskCOutput": "Hello from task C, world!"}.
    """
    return {f"task{t}Output": ctx.step(t.lower(), hello_from, t, name) for t in "ABC"}


@durable.workflow("examples.sequential_c")
def sequential_c(ctx, name):
    return ctx.step("c", hello_from, "C", name)


@durable.workflow("examples.sequential_b")
def sequential_b(ctx, name):
    task_b = ctx.step("b", hello_from, "B", name)
    return {"taskBOutput": task_b, "taskCOutput": ctx.child("c", sequential_c, name)}


@durable.workflow("examples.sequential_manually")
def sequential_manually(ctx, name):
    """Sequential tasks made by hand: each task starts the next as its child. Input: name="world".

    Output: as examples.sequential.
    """
    task_a = ctx.step("a", hello_from, "A", name)
    rest = ctx.child("b", sequential_b, name)
    return {"taskAOutput": task_a, **rest}


@durable.workflow("examples.parents_in_sequence")
def parents_in_sequence(ctx, name):
    """Two parent tasks with parallel children, one after the other. Input: name="world".

    Output: {"taskAOutput", "taskA1Output", "taskA2Output", "taskBOutput", "taskB1Output",
    "taskB2Output"}, each "Hello from task X, world!".
    """
    output = {}
    for parent in "AB":
        output[f"task{parent}Output"] = ctx.step(parent.lower(), hello_from, parent, name)
        first, second = ctx.parallel(
            [ctx.call(f"{parent.lower()}{i}", hello_from, f"{parent}{i}", name) for i in (1, 2)],
            key=f"{parent.lower()}-children",
        )
        output[f"task{parent}1Output"], output[f"task{parent}2Output"] = first, second
    return output


@durable.workflow("examples.tree_a")
def tree_a(ctx, name):
    task_a = ctx.step("a", hello_from, "A", name)
    children = ctx.parallel([ctx.call(f"a{i}", hello_from, f"A{i}", name) for i in (1, 2, 3)])
    return {"taskAOutput": task_a, **{f"taskA{i}Output": out for i, out in enumerate(children, 1)}}


@durable.workflow("examples.tree_b")
def tree_b(ctx, name):
    return {f"taskB{i}Output": ctx.step(f"b{i}", hello_from, f"B{i}", name) for i in (1, 2, 3)}


@durable.workflow("examples.task_tree")
def task_tree(ctx, name):
    """A tree: the root runs A (with three parallel children) and B (three in sequence) at once.

    Input: name="world". Output: {"rootOutput": "Hello from root task, world!", "taskAOutput",
    "taskA1Output", "taskA2Output", "taskA3Output", "taskB1Output", "taskB2Output",
    "taskB3Output"}, each "Hello from task X, world!".
    """
    root = ctx.step("root", hello_from, "root", name).replace("task root", "root task")
    branch_a = ctx.start_child("a", tree_a, name)
    branch_b = ctx.start_child("b", tree_b, name)
    return {"rootOutput": root, **branch_a.result(), **branch_b.result()}


@durable.workflow("examples.recursive")
def recursive(ctx, index=0):
    """A recursive task: each run starts the next as its child until index 9. Input: index=0.

    Output: {"count": 10}.
    """
    ctx.sleep("pause", 0.001)
    if index >= 9:
        return {"count": 1}
    return {"count": 1 + ctx.child("next", recursive, index + 1)["count"]}


def read_value(available_at):
    """The value appears at `available_at` (an ISO time): before it, there is nothing to read."""
    from datetime import datetime

    return 10 if timezone.now() >= datetime.fromisoformat(available_at) else None


@durable.workflow("examples.polling")
def polling(ctx, available_at):
    """Poll every 100 ms until a value appears (two seconds after the start in the README).

    Input: available_at=<an ISO time>. Output: {"count": <polls, between 10 and 20 for two
    seconds>, "value": 10}.
    """
    count = 0
    while True:
        count += 1
        value = ctx.step(f"poll:{count}", read_value, available_at)
        if value is not None:
            return {"count": count, "value": value}
        ctx.sleep(f"wait:{count}", 0.1)
