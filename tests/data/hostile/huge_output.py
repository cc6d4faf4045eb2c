# Prints forever: the reader must cap what it keeps and kill the program.
line = "A" * 1000
while True:
    print(line)
